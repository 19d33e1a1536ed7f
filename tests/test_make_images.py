"""The synthetic image generator and the torchvision baselines built on it."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from feedline.datagen.images import MARKER, make_images, read_marker
from feedline.benchmarks.image_baselines import decode_bound, image_files
from feedline.loader.epochs import batch_size_of, measure_loader

COUNT, CLASSES = 60, 10
# Colour JPEGs aim at 55-140 KB and are refitted when more than 12% off target; a fit can still
# miss when the texture strength hits its limits, so single files may stray to 40-180 KB.
JPEG_KB_BOUNDS = (40, 180)
JPEG_KB_MEDIAN_BOUNDS = (60, 130)


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("images") / "seed0"
    summary = make_images(root, COUNT, CLASSES, seed=0, progress=False, workers=2)
    return root, summary


def test_same_seed_gives_identical_bytes_whatever_the_worker_count(generated, tmp_path):
    root, _ = generated
    again = tmp_path / "again"
    make_images(again, COUNT, CLASSES, seed=0, progress=False, workers=1)
    assert _digests(again) == _digests(root)


def test_another_seed_gives_different_files(generated, tmp_path):
    root, _ = generated
    other = tmp_path / "seed1"
    make_images(other, COUNT, CLASSES, seed=1, progress=False, workers=1)
    first, second = _digests(root), _digests(other)
    images = [name for name in first if name != MARKER]
    differing = [name for name in images if first[name] != second.get(name)]
    assert len(differing) == len(images)


def test_layout_is_image_folder(generated):
    root, summary = generated
    class_dirs = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert class_dirs == [f"class_{c:03d}" for c in range(CLASSES)]
    files = image_files(root)
    assert len(files) == COUNT
    for class_dir in class_dirs:
        assert len(list((root / class_dir).iterdir())) == COUNT // CLASSES
    assert Path(files[0]).name == "img_000000.jpg"
    assert summary["count"] == COUNT and summary["classes"] == CLASSES


def test_sides_and_jpeg_sizes_are_photo_like(generated):
    root, summary = generated
    jpeg_kb = []
    for path in image_files(root):
        with Image.open(path) as image:
            assert all(300 <= side <= 800 for side in image.size), (path, image.size)
            if image.format == "JPEG" and image.mode == "RGB":
                jpeg_kb.append(Path(path).stat().st_size / 1024)
    assert len(jpeg_kb) >= COUNT - 2
    assert JPEG_KB_BOUNDS[0] <= min(jpeg_kb) and max(jpeg_kb) <= JPEG_KB_BOUNDS[1], jpeg_kb
    assert JPEG_KB_MEDIAN_BOUNDS[0] <= np.median(jpeg_kb) <= JPEG_KB_MEDIAN_BOUNDS[1]
    assert 300 <= summary["min_side"] <= summary["max_side"] <= 800


def test_grayscale_jpeg_and_png_are_mixed_in_and_decode(generated):
    root, summary = generated
    kinds = {}
    for path in image_files(root):
        with Image.open(path) as image:
            image.load()
            kinds.setdefault((image.format, image.mode), []).append(path)
    assert len(kinds[("JPEG", "L")]) >= 1
    assert len(kinds[("PNG", "RGB")]) >= 1
    assert all(p.endswith(".png") for p in kinds[("PNG", "RGB")])
    assert summary["grayscale"] == len(kinds[("JPEG", "L")])
    assert summary["png"] == len(kinds[("PNG", "RGB")])


def test_marker_records_the_run(generated):
    root, summary = generated
    marker = json.loads((root / MARKER).read_text())
    assert marker == read_marker(root)
    assert (marker["count"], marker["classes"], marker["seed"]) == (COUNT, CLASSES, 0)
    assert marker["bytes"] == sum(Path(p).stat().st_size for p in image_files(root))
    assert marker["bytes"] == summary["bytes"]


def test_rerun_replaces_a_previous_output(tmp_path):
    make_images(tmp_path, 6, 3, seed=0, progress=False, workers=1)
    make_images(tmp_path, 2, 1, seed=0, progress=False, workers=1)
    assert [Path(p).name for p in image_files(tmp_path)] == ["img_000000.jpg", "img_000001.jpg"]
    assert read_marker(tmp_path)["count"] == 2


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"count": 0}, ValueError, "count"),
        ({"count": 2.5}, ValueError, "count must be a positive integer, got 2.5"),
        ({"count": True}, ValueError, "count must be a positive integer, got True"),
        ({"classes": 0}, ValueError, "classes"),
        ({"classes": 5, "count": 4}, ValueError, "classes"),
        ({"seed": -1}, ValueError, "seed"),
        ({"workers": 0}, ValueError, "workers"),
    ],
)
def test_bad_arguments_are_named(tmp_path, kwargs, error, words):
    arguments = {"out": tmp_path / "out", "count": 4, "classes": 2, "seed": 0, "progress": False}
    arguments.update(kwargs)
    with pytest.raises(error, match=words):
        make_images(**arguments)


def test_refuses_a_foreign_non_empty_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match=str(tmp_path)):
        make_images(tmp_path, 4, 2, seed=0, progress=False)
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_refuses_a_file_as_output(tmp_path):
    target = tmp_path / "file"
    target.write_text("")
    with pytest.raises(ValueError, match="out"):
        make_images(target, 4, 2, seed=0, progress=False)


class _Epochs:
    """Batches of sizes 4, 4, 3 per epoch; counts how often it was asked for an epoch."""

    def __init__(self, make_batch):
        self.make_batch = make_batch
        self.epochs = 0

    def __call__(self):
        self.epochs += 1
        return (self.make_batch(n) for n in (4, 4, 3))


def test_measure_loader_counts_samples_across_epochs():
    epochs = _Epochs(lambda n: {"image": np.zeros((n, 3, 2, 2)), "label": np.arange(n)})
    result = measure_loader(epochs, batches=7, warmup=2)
    # warm-up takes 4 + 4; then 3 | 4 4 3 | 4 4 3 -> 25 samples over three epochs.
    assert result["samples"] == 25 and result["batches"] == 7
    assert epochs.epochs == 3
    assert result["samples_per_s"] == pytest.approx(result["samples"] / result["seconds"])


def test_measure_loader_accepts_tuples_and_rejects_empty_iterables():
    epochs = _Epochs(lambda n: (np.zeros((n, 5)), np.zeros(n)))
    assert measure_loader(epochs, batches=3, warmup=0)["samples"] == 11
    with pytest.raises(ValueError, match="no batches"):
        measure_loader(lambda: [], batches=1, warmup=0)
    with pytest.raises(TypeError, match="iterable_factory"):
        measure_loader([np.zeros(2)], batches=1, warmup=0)
    assert batch_size_of([{"x": np.zeros((6, 1))}]) == 6


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    make_images(root, 16, 2, seed=3, progress=False, workers=1)
    return root


@pytest.mark.parametrize(
    ("loader_name", "dtype_name"),
    [
        ("torchvision_train_loader", "float32"),
        ("torchvision_val_loader", "float32"),
        ("torchvision_train_loader_uint8", "uint8"),
        ("torchvision_val_loader_uint8", "uint8"),
    ],
)
def test_torchvision_loaders_yield_batches_of_the_right_shape(
    small_folder, loader_name, dtype_name
):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from feedline.benchmarks import image_baselines

    loader = getattr(image_baselines, loader_name)(small_folder, batch_size=8, workers=0, size=64)
    images, labels = next(iter(loader))
    assert images.shape == (8, 3, 64, 64)
    assert images.dtype == getattr(torch, dtype_name)
    assert labels.dtype == torch.int64 and set(labels.tolist()) <= {0, 1}
    if dtype_name == "float32":
        assert images.min() < 0 < images.max()


def test_torchvision_loader_rejects_a_missing_root(tmp_path):
    pytest.importorskip("torchvision")
    from feedline.benchmarks.image_baselines import torchvision_train_loader

    with pytest.raises(ValueError, match="root"):
        torchvision_train_loader(tmp_path / "missing", batch_size=8, workers=0)


def test_decode_bound_reports_both_decoders(small_folder):
    pytest.importorskip("nvidia.dali")
    result = decode_bound(image_files(small_folder), seconds_budget=4.0, workers=1)
    assert result["pil_samples_per_s"] > 0 and result["dali_samples_per_s"] > 0
    assert result["bound_samples_per_s"] == max(
        result["pil_samples_per_s"], result["dali_samples_per_s"]
    )
    assert result["bound_source"] in ("pil", "dali")
