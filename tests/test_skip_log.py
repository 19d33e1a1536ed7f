"""One log of skipped samples per Loader (``feedline.loader.skip_log``): a sample is listed once, by its index
(an image) or by where it is (a table's row or file), whoever met it and however often: before and after the
placement controller moves the Loader to a new runner, and after a resume."""
from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from conftest import write_images
from feedline.loader import Loader
from feedline.loader import epoch_stream, opened_pipeline
from feedline.loader.background import BackgroundStream
from feedline.loader.errors import DataError, Skipped
from feedline.loader.placement import controller as controller_module
from feedline.loader.skip_log import LOGGED, SkipLog
from feedline.pipelines import image

GOOD_IMAGES = 5
BAD = 2  # the dataset index of the bad image


def test_an_image_is_listed_once_by_its_index_and_a_table_row_by_where_it_is():
    log = SkipLog()
    assert log.add_error(DataError("a.jpg", "not a jpeg"), index=3, epoch=0)
    assert not log.add_error(DataError("a.jpg", "too many pixels for its batch"), index=3, epoch=1)
    assert log.add(Skipped("day.tsv:5", "expected 40 fields"))
    assert not log.add(Skipped("day.tsv:5", "expected 40 fields"))
    assert log.add(Skipped("day.tsv:6", "expected 40 fields"))
    assert log.add(Skipped("empty.tsv", "file is empty"))
    assert log.skipped == [Skipped("a.jpg", "not a jpeg", 3, 0), Skipped("day.tsv:5", "expected 40 fields"),
                           Skipped("day.tsv:6", "expected 40 fields"), Skipped("empty.tsv", "file is empty")]


def test_a_resumed_state_comes_first_and_its_samples_are_not_listed_again():
    log = SkipLog()
    listed = log.skipped
    log.add(Skipped("b.jpg", "bad", 7, 1))
    log.add(Skipped("c.jpg", "bad", 9, 1))
    log.load([Skipped("c.jpg", "bad", 9, 0), Skipped("a.jpg", "bad", 1, 0)])  # met in epoch 0 by the saver
    assert log.skipped is listed  # changed in place: every writer keeps writing to it
    assert log.skipped == [Skipped("c.jpg", "bad", 9, 0), Skipped("a.jpg", "bad", 1, 0), Skipped("b.jpg", "bad", 7, 1)]
    assert not log.add(Skipped("a.jpg", "bad", 1, 2))
    assert len(log) == 3


def test_each_new_skip_is_logged_once_and_the_first_ones_only(caplog):
    log = SkipLog()
    with caplog.at_level(logging.WARNING, logger="feedline"):
        for k in range(LOGGED + 5):
            log.add(Skipped(f"day.tsv:{k}", "bad"))
            log.add(Skipped(f"day.tsv:{k}", "bad"))
    one_by_one = [r.getMessage() for r in caplog.records if r.getMessage().startswith("feedline: skipped ")]
    assert one_by_one == [f"feedline: skipped day.tsv:{k}: bad" for k in range(LOGGED)]
    assert sum("not logged one by one" in r.getMessage() for r in caplog.records) == 1
    assert len(log) == LOGGED + 5


@pytest.fixture(scope="module")
def folder_with_a_bad_image(tmp_path_factory):
    root = tmp_path_factory.mktemp("skip_log")
    write_images(root, GOOD_IMAGES, classes=1, seed=4, sizes=[(64, 48)] * GOOD_IMAGES)
    (root / "class_0" / f"img_000{BAD}.jpg").write_bytes(b"not a jpeg at all")
    return root


def on_an_emulated_gpu(monkeypatch, spec):
    """A machine whose placement controller sees a GPU; the runners of GPU placements make their batches with
    the CPU placement here (as in test_gpu_fallback), so that the controller can move the Loader off the GPU."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(controller_module, "gpu_available", lambda: True)
    monkeypatch.setattr(epoch_stream, "BackgroundStream",
                        lambda make, depth, *, cuda=None, describe: BackgroundStream(make, depth, describe=describe))
    make = opened_pipeline.make_runner
    made = []

    def make_runner(pipeline, source, config, **kwargs):
        made.append(config.cut)
        return make(pipeline, source, dataclasses.replace(config, cut=spec.all_cpu, device=cpu), **kwargs)

    monkeypatch.setattr(opened_pipeline, "make_runner", make_runner)
    return made


def good_indices(loader) -> list[int]:
    return sorted(i for batch in loader for i in batch["index"][batch["valid"]].tolist())


def test_a_skip_met_before_and_after_a_move_and_after_a_resume_is_listed_once(folder_with_a_bad_image,
                                                                             monkeypatch, caplog):
    spec = image.train(folder_with_a_bad_image, size=16, output="uint8", on_error="skip")
    good = [i for i in range(GOOD_IMAGES) if i != BAD]
    saver = Loader(spec, batch_size=2, placement="cpu", seed=1)
    assert good_indices(saver) == good
    state = saver.state_dict()  # at the start of epoch 1; the bad image was met in epoch 0
    assert [(s.index, s.epoch) for s in saver.skipped] == [(BAD, 0)]

    made = on_an_emulated_gpu(monkeypatch, spec)
    loader = Loader(spec, batch_size=2, placement="gpu", seed=1)
    caplog.clear()  # (the saver logged its own)
    with caplog.at_level(logging.WARNING, logger="feedline"):
        loader.set_epoch(1)
        assert good_indices(loader) == good  # met on the GPU placement's runner
        with pytest.warns(RuntimeWarning, match="continuing on the CPU placement"):
            assert loader.placer.fall_back(torch.cuda.OutOfMemoryError("CUDA out of memory"))
        assert made == [1, spec.all_cpu] and loader.cut == spec.all_cpu
        assert good_indices(loader) == good  # met again on the CPU placement's runner, in epoch 2
        assert [(s.index, s.epoch) for s in loader.skipped] == [(BAD, 1)]
        loader.load_state_dict(state)  # back to epoch 1, with the saver's list (met in epoch 0)
        assert [(s.index, s.epoch) for s in loader.skipped] == [(BAD, 0)]
        assert good_indices(loader) == good  # and met once more
    assert loader.skipped == saver.skipped
    assert loader.state_dict()["skipped"] == [[saver.skipped[0].where, saver.skipped[0].reason, BAD, 0]]
    logged = [r for r in caplog.records if r.getMessage().startswith("feedline: skipped ")]
    assert len(logged) == 1 and logged[0].getMessage().endswith(f"img_000{BAD}.jpg: {saver.skipped[0].reason}")
    loader.close()
    saver.close()


def test_a_tables_bad_rows_and_files_are_listed_once_across_a_move_and_a_resume(tmp_path, monkeypatch):
    from feedline.datagen.synthetic_criteo import make_criteo
    from feedline.pipelines.criteo import criteo

    make_criteo(tmp_path / "good.tsv", 60, seed=3)
    lines = (tmp_path / "good.tsv").read_text().splitlines()
    lines.insert(4, "1\t2\tnot enough fields")
    lines.insert(40, "x" * 10)
    (tmp_path / "a.tsv").write_text("\n".join(lines) + "\n")
    (tmp_path / "b.tsv").write_text("")  # a whole file skipped when the table is opened
    spec = criteo([str(tmp_path / "a.tsv"), str(tmp_path / "b.tsv")], table_sizes=100, on_error="skip")
    expected = [str(tmp_path / "b.tsv"), f"{tmp_path / 'a.tsv'}:5", f"{tmp_path / 'a.tsv'}:41"]
    whole = Loader(spec, batch_size=8, placement="cpu", shuffle=False)
    good = good_indices(whole)
    assert [s.where for s in whole.skipped] == expected and len(good) == 60

    made = on_an_emulated_gpu(monkeypatch, spec)
    loader = Loader(spec, batch_size=8, placement="gpu", shuffle=False)
    assert good_indices(loader) == good
    with pytest.warns(RuntimeWarning, match="continuing on the CPU placement"):
        assert loader.placer.fall_back(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert len(made) == 2 and made[-1] == spec.all_cpu and loader.cut == spec.all_cpu
    assert good_indices(loader) == good  # every bad row met again, on the new runner
    assert loader.skipped == whole.skipped and loader.dataset.skipped == loader.skipped  # one list
    resumed = Loader(spec, batch_size=8, placement="cpu", shuffle=False)
    resumed.load_state_dict(loader.state_dict())
    assert good_indices(resumed) == good
    loader.load_state_dict(whole.state_dict())
    assert good_indices(loader) == good
    assert resumed.skipped == loader.skipped == whole.skipped
    for each in (whole, loader, resumed):
        each.close()
