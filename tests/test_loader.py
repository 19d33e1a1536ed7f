"""The Loader end to end on DALI's CPU backend: coverage, sharding, resumption and the errors a user sees."""

import pytest
import torch

from feedline.loader import DataError, Loader, PlacementError
from feedline.loader.devices import gpu_available
from feedline.loader.sources import open_source
from feedline.pipelines import image

from conftest import write_images


@pytest.fixture(scope="module")
def small_train(image_dir):
    return image.train(image_dir, size=32, output="uint8")


def listed(spec):
    return open_source(spec.source)


def epoch_indices(loader):
    return [i for b in loader for i in b["index"].tolist()]


@pytest.mark.parametrize("shuffle", [False, True])
def test_one_epoch_yields_every_file_once(small_train, shuffle):
    loader = Loader(small_train, batch_size=8, shuffle=shuffle, seed=3, placement="cpu")
    seen = epoch_indices(loader)
    assert sorted(seen) == list(range(len(listed(small_train))))
    assert len(loader) == 5  # 37 images in batches of 8, last one partial
    second = epoch_indices(loader)
    assert sorted(second) == sorted(seen)
    assert (second != seen) == shuffle  # a new epoch reshuffles


def test_labels_follow_their_files(small_train):
    loader = Loader(small_train, batch_size=16, placement="cpu")
    for batch in loader:
        for i, label in zip(batch["index"].tolist(), batch["label"].tolist()):
            folder = listed(small_train).paths[i].split("/")[-2]
            assert listed(small_train).classes[label] == folder


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("policy", ["partial", "pad"])
def test_ranks_together_cover_the_dataset_exactly_once(small_train, world, policy):
    valid = []
    for rank in range(world):
        loader = Loader(small_train, batch_size=4, placement="cpu", seed=7, rank=rank, world_size=world,
                        last_batch=policy)
        for batch in loader:
            mask = batch.get("valid", torch.ones(len(batch["index"]), dtype=torch.bool))
            assert len(batch["index"]) == len(batch["image"]) == len(mask)
            valid += batch["index"][mask].tolist()
    assert sorted(valid) == list(range(len(listed(small_train))))


def test_drop_delivers_full_batches_only(small_train):
    loader = Loader(small_train, batch_size=8, placement="cpu", last_batch="drop")
    sizes = [len(b["index"]) for b in loader]
    assert sizes == [8, 8, 8, 8]


def test_same_seed_same_order_other_seed_other_order(small_train):
    a = epoch_indices(Loader(small_train, batch_size=8, seed=1, placement="cpu"))
    b = epoch_indices(Loader(small_train, batch_size=8, seed=1, placement="cpu"))
    c = epoch_indices(Loader(small_train, batch_size=8, seed=2, placement="cpu"))
    assert a == b and a != c


def test_resume_mid_epoch_gives_the_same_batches(small_train):
    reference = Loader(small_train, batch_size=6, seed=5, placement="cpu")
    epoch0 = [(b["index"].clone(), b["image"].clone()) for b in reference]
    interrupted = Loader(small_train, batch_size=6, seed=5, placement="cpu")
    it = iter(interrupted)
    for _ in range(3):
        next(it)
    state = interrupted.state_dict()
    resumed = Loader(small_train, batch_size=6, seed=5, placement="cpu")
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(epoch0) - 3
    for (idx, img), batch in zip(epoch0[3:], rest, strict=True):
        assert torch.equal(idx, batch["index"]) and torch.equal(img, batch["image"])


def test_breaking_out_starts_the_next_epoch(small_train):
    loader = Loader(small_train, batch_size=8, seed=5, placement="cpu")
    next(iter(loader))
    assert loader.epoch == 0
    full = epoch_indices(loader)
    assert loader.epoch == 1 and sorted(full) == list(range(len(listed(small_train))))
    loader.set_epoch(0)
    again = Loader(small_train, batch_size=8, seed=5, placement="cpu")
    assert epoch_indices(loader) == epoch_indices(again)


def test_state_from_another_configuration_is_refused(small_train):
    state = Loader(small_train, batch_size=6, placement="cpu").state_dict()
    other = Loader(small_train, batch_size=5, placement="cpu")
    with pytest.raises(ValueError, match="batch_size"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        other.load_state_dict({"epoch": 0})


@pytest.mark.skipif(gpu_available(), reason="checks the error on machines without a GPU")
def test_gpu_placement_without_gpu_is_a_clear_error(small_train):
    with pytest.raises(PlacementError, match="needs a CUDA GPU"):
        Loader(small_train, batch_size=4, placement="gpu")
    with pytest.raises(ValueError, match="no usable CUDA GPU"):
        Loader(small_train, batch_size=4, placement="cpu", device="cuda")
    assert Loader(small_train, batch_size=4, placement="auto").placement["decode"] == "cpu"


def val_uint8(data):
    return image.val(data, output="uint8")


@pytest.mark.gpu(pipeline=val_uint8)
@pytest.mark.parametrize("placement", ["gpu", {"resize": "gpu"}, {"center_crop": "gpu"}])
def test_gpu_placements_equal_cpu(image_dir, placement):
    spec = val_uint8(image_dir)
    cpu = next(iter(Loader(spec, batch_size=8, shuffle=False, placement="cpu")))
    gpu = next(iter(Loader(spec, batch_size=8, shuffle=False, placement=placement, device="cuda")))
    assert gpu["image"].is_cuda and torch.equal(cpu["index"], gpu["index"].cpu())
    assert (cpu["image"].int() - gpu["image"].cpu().int()).abs().max() <= 1


@pytest.mark.parametrize("kwargs,error,match", [
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"batch_size": 4, "placement": "fastest"}, ValueError, "placement must be one of"),
    ({"batch_size": 4, "device": "tpu"}, ValueError, "device"),
    ({"batch_size": 4, "last_batch": "keep"}, ValueError, "last_batch"),
    ({"batch_size": 4, "rank": 1}, ValueError, "rank and world_size"),
    ({"batch_size": 4, "rank": 2, "world_size": 2}, ValueError, "rank"),
    ({"batch_size": 4, "num_threads": 0}, ValueError, "num_threads"),
    ({"batch_size": 4, "prefetch": 0}, ValueError, "prefetch"),
    ({"batch_size": 4, "shuffle": "yes"}, TypeError, "shuffle"),
])
def test_bad_loader_arguments_are_named(small_train, kwargs, error, match):
    with pytest.raises(error, match=match):
        Loader(small_train, **kwargs)


def test_pipeline_must_be_a_definition():
    with pytest.raises(TypeError, match="pipeline must be a feedline pipeline"):
        Loader("/data/train", batch_size=4)


@pytest.mark.parametrize("kwargs,match", [
    ({"size": 0}, "size"), ({"scale": (0.5, 0.1)}, "scale"), ({"ratio": (1, 2, 3)}, "ratio"),
    ({"flip_prob": 2}, "flip_prob"), ({"output": "float16"}, "output"),
])
def test_bad_pipeline_arguments_are_named(image_dir, kwargs, match):
    with pytest.raises(ValueError, match=match):
        image.train(image_dir, **kwargs)


def test_missing_empty_and_imageless_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        image.train(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="no class sub-folders"):
        Loader(image.train(tmp_path), batch_size=4)
    (tmp_path / "cats").mkdir()
    (tmp_path / "cats" / "notes.txt").write_text("not an image")
    with pytest.raises(ValueError, match="no image files"):
        Loader(image.val(tmp_path), batch_size=4)


def test_file_list_source(tmp_path, image_dir):
    src = listed(image.train(image_dir))
    lines = [f"{p} {label}" for p, label in zip(src.paths[:5], src.labels[:5])]
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    spec = image.val(tmp_path / "list.txt", size=32, output="uint8")
    batch = next(iter(Loader(spec, batch_size=5, shuffle=False, placement="cpu")))
    assert batch["label"].tolist() == src.labels[:5].tolist()
    (tmp_path / "bad.txt").write_text(f"{src.paths[0]} 0\n{src.paths[1]} cat\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: label must be an integer"):
        Loader(image.val(tmp_path / "bad.txt"), batch_size=4)
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ValueError, match="lists no images"):
        Loader(image.val(tmp_path / "empty.txt"), batch_size=4)


def corrupt_dataset(tmp_path, name, payload):
    write_images(tmp_path, 5, classes=1, seed=2)
    target = tmp_path / "class_0" / name
    target.write_bytes(payload(target))
    return target


@pytest.mark.parametrize("name,payload,match", [
    ("zz_text.jpg", lambda p: b"this is not a jpeg", "not an image"),
    ("zz_empty.jpg", lambda p: b"", "empty"),
    ("img_0001.jpg", lambda p: p.read_bytes()[:6000], "corrupt or truncated"),
])
def test_bad_files_are_named(tmp_path, name, payload, match):
    bad = corrupt_dataset(tmp_path, name, payload)
    loader = Loader(image.train(tmp_path, size=32), batch_size=3, shuffle=False, placement="cpu")
    with pytest.raises(DataError, match=match) as info:
        list(loader)
    assert str(bad) in str(info.value)


def test_file_deleted_after_listing(tmp_path):
    paths = write_images(tmp_path, 4, classes=1)
    loader = Loader(image.train(tmp_path, size=32), batch_size=2, shuffle=False, placement="cpu")
    paths[2].unlink()
    with pytest.raises(DataError, match="not found") as info:
        list(loader)
    assert str(paths[2]) in str(info.value)


def test_batches_a_trainer_keeps_stay_intact(small_train):
    """Output buffers are reused only once the trainer lets go of them: kept batches are never overwritten."""
    spec = image.train(listed(small_train).origin, size=32)
    copies = [(b["index"].clone(), b["image"].clone()) for b in Loader(spec, batch_size=4, seed=1, placement="cpu")]
    kept = list(Loader(spec, batch_size=4, seed=1, placement="cpu"))
    views = [b["image"][0] for b in Loader(spec, batch_size=4, seed=1, placement="cpu")]
    for (index, image_copy), batch, view in zip(copies, kept, views, strict=True):
        assert torch.equal(batch["index"], index) and torch.equal(batch["image"], image_copy)
        assert torch.equal(view, image_copy[0])


def test_dropped_batches_are_reused(small_train):
    spec = image.train(listed(small_train).origin, size=32)
    loader = Loader(spec, batch_size=4, seed=1, placement="cpu")
    for _ in loader:
        pass
    assert loader.runner.outputs_reused > 0


def test_profile_and_stats_are_asked_of_the_loader(image_dir):
    """``loader.profile()`` and ``loader.stats()`` are ``feedline.loader.profile`` and ``feedline.loader.stats``
    for this loader: the profile leaves its saved position as it was, and the stats then show its stage times."""
    from feedline.loader.stats import loader_stats

    loader = Loader(image.val(image_dir, size=32), batch_size=8, placement="cpu", shuffle=False)
    first = next(iter(loader))["index"].tolist()
    saved = loader.state_dict()
    profile = loader.profile(batches=2)
    assert (profile.pipeline, profile.batch_size, profile.placement["placement"]) == ("image-val", 8, "cpu")
    assert loader.state_dict() == saved
    stats = loader.stats()
    assert stats == loader_stats(loader) and stats["stages_measured_by"] == "loader.profile()"
    assert set(stats["stages"]) == {s.name for s in loader.pipeline.stages}
    assert first == list(range(8))
    loader.close()


def test_stats_count_what_the_trainer_was_given(image_dir):
    loader = Loader(image.val(image_dir, size=32), batch_size=8, placement="cpu", last_batch="pad")
    assert loader.stats()["delivered_samples_per_s"] is None  # nothing delivered yet
    batches = list(loader)
    stats = loader.stats()
    assert stats["batches"] == len(batches) == 5  # 37 images
    assert stats["delivered_samples_per_s"] > 0 and 0.0 <= stats["trainer_wait_share"] <= 1.0
    loader.close()
