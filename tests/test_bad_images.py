"""on_error for image pipelines: every bad case raises a DataError naming the file, or with "skip" is left
out, listed and counted while every good sample still arrives exactly once."""
import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from torchvision.transforms import v2

from feedline.loader import DataError, Loader
from feedline.pipelines import image

from conftest import write_images
from corrupt_images import CASES, REASONS, payload

BAD = [c for c, kind in CASES.items() if kind == "bad"] + ["deleted"]
GOOD = [c for c, kind in CASES.items() if kind == "good"]


def loader_with(tmp_path, case, **kwargs):
    """A Loader over 11 good photos and one special file, placed in the middle of the order ("deleted": a
    file deleted after the Loader listed the folder). Returns the loader and the special file's path."""
    write_images(tmp_path, 11, classes=1, seed=4)
    target = tmp_path / "class_0" / "img_0005x.jpg"
    target.write_bytes(payload("truncated" if case == "deleted" else case, seed=1))
    loader = Loader(image.train(tmp_path, size=48, output="uint8"), batch_size=4, placement="cpu", **kwargs)
    if case == "deleted":
        target.unlink()
    return loader, str(target)


@pytest.mark.parametrize("case", BAD)
def test_raise_names_the_file_and_the_reason(tmp_path, case):
    loader, target = loader_with(tmp_path, case, shuffle=False)
    with pytest.raises(DataError) as info:
        list(loader)
    assert info.value.where == target and REASONS[case] in info.value.reason


@pytest.mark.parametrize("case", BAD)
@pytest.mark.parametrize("shuffle", [False, True])
def test_skip_leaves_out_only_the_bad_file(tmp_path, case, shuffle):
    loader, target = loader_with(tmp_path, case, shuffle=shuffle, seed=2, on_error="skip")
    bad_index = loader.source.paths.index(target)
    for epoch in range(2):
        sizes, seen = [], []
        for batch in loader:
            sizes.append(len(batch["index"]))
            seen += batch["index"][batch["valid"]].tolist() if "valid" in batch else batch["index"].tolist()
        assert sorted(seen) == [i for i in range(12) if i != bad_index]
        # The batch with the bad file is filled from the next good ones; the slot the epoch lacks at its end
        # is padding (valid False), so the rank still makes its 3 planned batches of 4.
        assert sizes == [4, 4, 4]
        assert batch["valid"].tolist() == [True] * 3 + [False] and batch["index"][-1] == -1
        assert loader.epoch_summaries[epoch] == {"batches": 3, "samples": 11, "padding": 1, "skipped": 1}
    assert [(s.where, s.index) for s in loader.skipped] == [(target, bad_index)]
    assert REASONS[case] in loader.skipped[0].reason


@pytest.mark.parametrize("case", GOOD)
def test_awkward_but_valid_files_decode_to_rgb(tmp_path, case):
    folder = tmp_path / "c"
    folder.mkdir()
    path = folder / "x.jpg"
    path.write_bytes(payload(case, seed=3))
    spec = image.val(tmp_path, size=96, output="uint8")
    batch = next(iter(Loader(spec, batch_size=1, placement="cpu")))
    assert batch["image"].shape == (1, 96, 96, 3)
    upright = ImageOps.exif_transpose(Image.open(path)).convert("RGB")  # EXIF orientation applied
    expected = np.asarray(v2.CenterCrop(96)(v2.Resize(110, antialias=True)(upright))).astype(int)
    diff = np.abs(batch["image"][0].numpy().astype(int) - expected)
    assert diff.mean() < 1.0 and diff.max() <= (3 if case == "cmyk" else 1), (diff.mean(), diff.max())


def test_size_limit_is_configurable(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(payload("grayscale", seed=1))  # 320 x 240
    spec = image.val(tmp_path, size=32)
    with pytest.raises(DataError, match="above the limit of 1000 pixels"):
        list(Loader(spec, batch_size=1, placement="cpu", max_pixels=1000))
    assert len(list(Loader(spec, batch_size=1, placement="cpu", max_pixels=320 * 240))) == 1


def test_an_epoch_whose_tail_is_all_bad_ends_in_padding(tmp_path):
    write_images(tmp_path, 4, classes=1, seed=6)
    for k in range(3):
        (tmp_path / "class_0" / f"zz_{k}.jpg").write_bytes(b"")
    spec = image.train(tmp_path, size=32, output="uint8")
    loader = Loader(spec, batch_size=2, shuffle=False, placement="cpu", on_error="skip")
    assert len(loader) == 4
    for _ in range(2):
        batches = list(loader)
        assert [b["index"].tolist() for b in batches] == [[0, 1], [2, 3], [-1, -1], [-1]]
        assert [b.get("valid", torch.ones(len(b["index"]), dtype=torch.bool)).tolist() for b in batches] == \
            [[True, True], [True, True], [False, False], [False]]
        assert all(not b["image"][~b["valid"]].any() for b in batches[2:])  # padding images are zeros
    assert len(loader.skipped) == 3


def test_an_epoch_with_no_good_sample_is_an_error(tmp_path):
    (tmp_path / "c").mkdir()
    for k in range(3):
        (tmp_path / "c" / f"zz_{k}.jpg").write_bytes(b"")
    loader = Loader(image.val(tmp_path, size=32), batch_size=2, placement="cpu", on_error="skip")
    with pytest.raises(DataError, match="every sample of epoch 0 on this rank was bad"):
        list(loader)


def test_resume_after_a_skip_gives_the_same_batches(tmp_path):
    loader, _ = loader_with(tmp_path, "truncated", seed=3, on_error="skip")
    spec = loader.pipeline
    full = [(b["index"].clone(), b["image"].clone()) for b in loader]
    first = Loader(spec, batch_size=4, seed=3, placement="cpu", on_error="skip")
    it = iter(first)
    next(it)
    state = first.state_dict()
    resumed = Loader(spec, batch_size=4, seed=3, placement="cpu", on_error="skip")
    resumed.load_state_dict(state)
    rest = [(b["index"], b["image"]) for b in resumed]
    assert len(rest) == len(full) - 1
    for (i, img), (j, img2) in zip(full[1:], rest, strict=True):
        assert torch.equal(i, j) and torch.equal(img, img2)


def test_on_error_must_be_raise_or_skip(image_dir):
    with pytest.raises(ValueError, match=r"on_error must be one of \['raise', 'skip'\]"):
        Loader(image.val(image_dir), batch_size=2, on_error="ignore")


@pytest.mark.parametrize("policy", ["partial", "pad", "drop"])
def test_every_rank_yields_its_planned_batches_whatever_it_skips(tmp_path, policy):
    """A bad file in one rank's shard only: that rank fills its batches from its next good samples and pads
    the end of its epoch, so both ranks step len(loader) times (a DDP job stays in lockstep) and the samples
    marked valid are every good sample of the shards exactly once."""
    write_images(tmp_path, 13, classes=1, seed=8)
    bad = tmp_path / "class_0" / "img_0003.jpg"
    bad.write_bytes(payload("text", seed=2))  # (a truncated JPEG may still decode where the crop window lies)
    spec = image.train(tmp_path, size=32, output="uint8")
    valid, shard_samples = [], set()
    for rank in range(2):
        loader = Loader(spec, batch_size=3, placement="cpu", seed=4, rank=rank, world_size=2, last_batch=policy,
                        on_error="skip")
        for epoch in range(2):
            batches = list(loader)
            assert len(batches) == len(loader)
            assert [len(b["index"]) for b in batches] == [len(p.indices) for p in loader.sampler.epoch(epoch)]
            for b in batches:
                mask = b.get("valid", torch.ones(len(b["index"]), dtype=torch.bool))
                valid += [(epoch, i) for i in b["index"][mask].tolist()]
            shard_samples |= {(epoch, i) for p in loader.sampler.epoch(epoch) for i in p.indices.tolist()}
        assert len(loader) == len(Loader(spec, batch_size=3, placement="cpu", rank=1 - rank, world_size=2,
                                         last_batch=policy))
    bad_index = sorted(str(p) for p in tmp_path.rglob("*.jpg")).index(str(bad))
    assert len(valid) == len(set(valid))
    assert set(valid) == {(e, i) for e, i in shard_samples if i != bad_index}
