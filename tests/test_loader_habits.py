"""What a torch DataLoader user does on the first day: iterating twice, DataLoader's arguments, its attributes,
``with``, a torchrun launch, and a validation set read in order."""
import threading
import warnings

import pytest
import torch

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import Loader
from feedline.loader.background import THREAD_NAME
from feedline.loader.guards import StaleIteratorError
from feedline.pipelines import image
from feedline.pipelines.criteo import criteo


@pytest.fixture(scope="module")
def train(image_dir):
    return image.train(image_dir, size=32, output="uint8")


def indices(batches):
    return [i for b in batches for i in b["index"].tolist()]


# ---- one active iterator ---------------------------------------------------------------------------------
def test_a_new_iterator_takes_over_and_the_old_one_says_so(train):
    loader = Loader(train, batch_size=8, placement="cpu", seed=1)
    old = iter(loader)
    first = next(old)
    new = iter(loader)
    whole = list(new)  # a full epoch (the next one: the first was started), not one batch
    assert sorted(indices(whole)) == list(range(37)) and len(whole) == 5
    with pytest.raises(StaleIteratorError, match="newer iter\\(loader\\) started"):
        next(old)
    assert len(first["index"]) == 8
    loader.close()


def test_peeking_with_next_iter_mid_epoch(train):
    loader = Loader(train, batch_size=8, placement="cpu", seed=2)
    epoch = iter(loader)
    taken = [next(epoch), next(epoch)]
    peeked = next(iter(loader))  # a DataLoader habit: it starts a new iteration
    with pytest.raises(StaleIteratorError):
        next(epoch)
    rest = list(loader)  # and the Loader goes on from there, each epoch whole
    assert sorted(indices(rest)) == list(range(37))
    assert len(taken) == 2 and len(peeked["index"]) == 8
    loader.close()


@pytest.mark.parametrize("stop", ["close", "load_state_dict"])
def test_an_iterator_stopped_under_it_says_what_stopped_it(tmp_path, stop):
    path = tmp_path / "c.tsv"
    make_criteo(path, rows=300, seed=1)
    loader = Loader(criteo(path), batch_size=64, placement="cpu", shuffle=True)
    it = iter(loader)
    next(it)
    saved = loader.state_dict()
    next(it)
    loader.close() if stop == "close" else loader.load_state_dict(saved)
    with pytest.raises(StaleIteratorError, match="close\\(\\), load_state_dict\\(\\) or set_epoch\\(\\)"):
        next(it)
    if stop == "load_state_dict":  # a new iteration goes on from the state loaded: the rest of the epoch
        assert sum(b["index"].shape[0] for b in loader) == 300 - 64
    loader.close()


def test_nested_loops_over_one_loader_fail_loudly(train):
    loader = Loader(train, batch_size=8, placement="cpu")
    with pytest.raises(StaleIteratorError):
        for _ in loader:
            for _ in loader:
                pass
    loader.close()


# ---- DataLoader's arguments ------------------------------------------------------------------------------
@pytest.mark.parametrize("argument,value,names", [
    ("num_workers", 4, "num_threads"), ("drop_last", True, "last_batch='drop'"), ("pin_memory", True, "device="),
    ("collate_fn", lambda b: b, "custom"), ("sampler", object(), "set_epoch"), ("persistent_workers", True, "persist"),
    ("prefetch_factor", 4, "prefetch="), ("worker_init_fn", print, "seed="), ("batch_sampler", object(), "batch_size="),
    ("generator", torch.Generator(), "seed="), ("multiprocessing_context", "spawn", "threads"),
])
def test_dataloader_arguments_name_feedlines_equivalent(train, argument, value, names):
    with pytest.raises(TypeError, match=f"{argument}= is a torch DataLoader argument") as info:
        Loader(train, batch_size=8, **{argument: value})
    assert names in str(info.value)


def test_a_misspelt_argument_gets_the_closest_name(train):
    with pytest.raises(TypeError, match="shufle= is not an argument of Loader; did you mean shuffle="):
        Loader(train, batch_size=8, shufle=False)
    with pytest.raises(TypeError, match="the Loader's arguments are pipeline, batch_size, placement"):
        Loader(train, batch_size=8, zzz=1)


# ---- attributes and with -----------------------------------------------------------------------------------
def test_batch_size_and_dataset(train, tmp_path):
    loader = Loader(train, batch_size=8, placement="cpu")
    assert loader.batch_size == 8 and len(loader.dataset) == 37
    assert list(loader.dataset.classes) == ["class_0", "class_1", "class_2"]
    make_criteo(tmp_path / "d.tsv", 500, seed=0)
    table = Loader(criteo(tmp_path / "d.tsv"), batch_size=64, placement="cpu")
    assert table.batch_size == 64 and len(table.dataset) == 500
    assert len(table) == 8  # ceil(500 / 64)


def test_with_closes_the_loader(train):
    def threads():
        return sum(t.name == THREAD_NAME and t.is_alive() for t in threading.enumerate())

    before = threads()
    with Loader(train, batch_size=8, placement="cpu") as loader:
        next(iter(loader))
        assert threads() == before + 1
    assert threads() == before and loader.background is None


# ---- torchrun without init_process_group ----------------------------------------------------------------------
def test_a_launcher_without_a_process_group_is_warned_about(train, monkeypatch):
    assert torch.distributed.is_available() and not torch.distributed.is_initialized()
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "1")
    with pytest.warns(UserWarning, match=r"WORLD_SIZE=4 is set .* not initialised.*init_process_group") as caught:
        loader = Loader(train, batch_size=8, placement="cpu")
    assert caught[0].filename == __file__  # points at the line that built the Loader
    assert loader.sampler.world_size == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Loader(train, batch_size=8, placement="cpu", rank=1, world_size=4)  # the user chose: no warning
        monkeypatch.setenv("WORLD_SIZE", "1")
        Loader(train, batch_size=8, placement="cpu")


# ---- shuffle defaults -------------------------------------------------------------------------------------
def test_validation_reads_in_listed_order_unless_asked(image_dir, tmp_path):
    val = image.val(image_dir, size=32)
    assert indices(Loader(val, batch_size=8, placement="cpu")) == list(range(37))
    shuffled = indices(Loader(val, batch_size=8, placement="cpu", shuffle=True))
    assert sorted(shuffled) == list(range(37)) and shuffled != list(range(37))
    trained = indices(Loader(image.train(image_dir, size=32), batch_size=8, placement="cpu"))
    assert sorted(trained) == list(range(37)) and trained != list(range(37))
    make_criteo(tmp_path / "d.tsv", 300, seed=0)
    rows = indices(Loader(criteo(tmp_path / "d.tsv"), batch_size=64, placement="cpu", shuffle_buffer=100))
    assert sorted(rows) == list(range(300)) and rows != list(range(300))
    assert Loader(val, batch_size=8, placement="cpu").state_dict()["config"]["shuffle"] is False
