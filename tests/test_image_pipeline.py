"""Image pipelines against an independent reference (PIL decode + torchvision resize/crop), on DALI's CPU."""
import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as F
from PIL import Image
from torchvision.transforms import v2

from feedline.loader import Loader
from feedline.loader.sources import open_source
from feedline.loader.sampler import BatchPlan
from feedline.pipelines import image
from runners import image_runner

# DALI's and PIL's libjpeg-turbo decode identically; the antialiased linear resizes differ only in how they
# round the filtered value, so a pixel may differ by one level of 255 and never by more. On smooth ramps
# that rounding lands on many pixels at once, hence a mean bound of half a level rather than zero.
MAX_LEVELS = 1
MEAN_LEVELS = 0.5
MEAN = np.array(image.IMAGENET_MEAN)[:, None, None]
STD = np.array(image.IMAGENET_STD)[:, None, None]


def reference_pixels(path):
    return Image.open(path).convert("RGB")


def assert_close_uint8(got_hwc: np.ndarray, ref_hwc: np.ndarray):
    diff = np.abs(got_hwc.astype(np.int16) - ref_hwc.astype(np.int16))
    assert diff.max() <= MAX_LEVELS and diff.mean() <= MEAN_LEVELS, (diff.max(), diff.mean())


def paths(spec):
    return open_source(spec.source).paths


def one_batch(spec, n, **kwargs):
    loader = Loader(spec, batch_size=n, shuffle=False, placement="cpu", **kwargs)
    return next(iter(loader))


@pytest.mark.parametrize("output", ["uint8", "float"])
def test_val_equals_torchvision_resize_centre_crop(image_dir, output):
    spec = image.val(image_dir, output=output)
    batch = one_batch(spec, 12)
    ref = v2.Compose([v2.Resize(256, antialias=True), v2.CenterCrop(224)])
    for k, i in enumerate(batch["index"].tolist()):
        expected = np.asarray(ref(reference_pixels(paths(spec)[i])))
        got = batch["image"][k].numpy()
        if output == "float":
            assert got.dtype == np.float32 and got.shape == (3, 224, 224)
            assert np.abs(got - (expected.transpose(2, 0, 1) / 255.0 - MEAN) / STD).max() <= 1.01 / 255 / STD.min()
            got = np.rint((got * STD + MEAN) * 255).clip(0, 255).transpose(1, 2, 0)
        assert_close_uint8(got, expected)
    assert batch["label"].tolist() == open_source(spec.source).labels[batch["index"].numpy()].tolist()


def test_train_decodes_exactly_the_planned_window(image_dir):
    spec = image.train(image_dir, size=160, output="uint8")
    runner = image_runner(spec, batch_size=10, seed=5, num_threads=2)
    plan = BatchPlan(np.arange(10, dtype=np.int64), np.ones(10, bool), epoch=1)
    host = runner.host_batch(plan)
    batch, _ = next(runner.batches(iter([plan])))
    flip = host.params[2]["flip"]
    assert 0 < flip.sum() < 10  # both branches exercised with this seed
    for k in range(10):
        x, y, w, h = host.params[0]["window"][k]  # the window the decoder took from random_resized_crop
        expected = np.asarray(F.resized_crop(reference_pixels(paths(spec)[k]), int(y), int(x), int(h), int(w),
                                             [160, 160], antialias=True))
        if flip[k]:
            expected = expected[:, ::-1]
        assert_close_uint8(batch["image"][k].numpy(), expected)


def test_train_float_output_shape_dtype_and_range(image_dir):
    batch = one_batch(image.train(image_dir, size=96), 8)
    img = batch["image"]
    assert img.shape == (8, 3, 96, 96) and img.dtype == torch.float32
    low = ((0 - MEAN) / STD).min() - 1e-4
    high = ((1 - MEAN) / STD).max() + 1e-4
    assert low <= img.min().item() and img.max().item() <= high
    assert batch["label"].dtype == torch.int64 and batch["index"].dtype == torch.int64


def test_a_flip_is_a_flip(image_dir):
    never = one_batch(image.train(image_dir, size=64, flip_prob=0.0, output="uint8"), 6)["image"]
    always = one_batch(image.train(image_dir, size=64, flip_prob=1.0, output="uint8"), 6)["image"]
    assert torch.equal(always, never.flip(2))
    never_f = one_batch(image.train(image_dir, size=64, flip_prob=0.0), 6)["image"]
    always_f = one_batch(image.train(image_dir, size=64, flip_prob=1.0), 6)["image"]
    assert torch.equal(always_f, never_f.flip(3))


def test_augmentation_depends_on_sample_not_on_batching(image_dir):
    spec = image.train(image_dir, size=64, output="uint8")
    by_index = {}
    for batch_size in (4, 7):
        loader = Loader(spec, batch_size=batch_size, seed=11, placement="cpu")
        images = {i: img for b in loader for i, img in zip(b["index"].tolist(), b["image"])}
        if by_index:
            assert all(torch.equal(images[i], by_index[i]) for i in images)
        by_index = images


def test_seed_changes_augmentation(image_dir):
    spec = image.train(image_dir, size=64, output="uint8")
    a = next(iter(Loader(spec, batch_size=8, shuffle=False, seed=1, placement="cpu")))["image"]
    b = next(iter(Loader(spec, batch_size=8, shuffle=False, seed=2, placement="cpu")))["image"]
    assert not torch.equal(a, b)


def test_grayscale_and_png_decode_to_rgb(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    gray = (np.add.outer(np.arange(300), np.arange(280)) % 256).astype(np.uint8)
    Image.fromarray(gray, "L").save(folder / "gray.jpg", quality=95)
    Image.fromarray(np.stack([gray] * 3, -1)).save(folder / "rgb.png")
    spec = image.val(tmp_path, output="uint8")
    batch = one_batch(spec, 2)
    assert batch["image"].shape == (2, 224, 224, 3)
    for k, i in enumerate(batch["index"].tolist()):
        expected = np.asarray(v2.CenterCrop(224)(v2.Resize(256, antialias=True)(reference_pixels(paths(spec)[i]))))
        assert_close_uint8(batch["image"][k].numpy(), expected)




def test_resize_to_height_and_width_equals_torchvision(image_dir):
    """``resize((h, w))``: both sides to the given size (not the shorter side), as torchvision's
    ``resize(img, [h, w], antialias=True)`` on the PIL-decoded image."""
    spec = image.pipeline(image_dir, [image.decode(), image.resize((45, 70))])
    batch = one_batch(spec, 8)
    assert batch["image"].shape == (8, 45, 70, 3) and batch["image"].dtype == torch.uint8
    for k, i in enumerate(batch["index"].tolist()):
        expected = np.asarray(F.resize(reference_pixels(paths(spec)[i]), [45, 70], antialias=True))
        assert_close_uint8(batch["image"][k].numpy(), expected)


def _resized(image_dir, *after):
    return one_batch(image.pipeline(image_dir, [image.decode(), image.resize((48, 40)), *after]), 8)["image"]


def test_vertical_flip_equals_torchvision(image_dir):
    plain = _resized(image_dir).permute(0, 3, 1, 2)  # CHW, as torchvision takes tensors
    always = _resized(image_dir, image.vertical_flip(1.0)).permute(0, 3, 1, 2)
    assert torch.equal(always, F.vertical_flip(plain))
    assert torch.equal(_resized(image_dir, image.vertical_flip(0.0)).permute(0, 3, 1, 2), plain)
    sometimes = _resized(image_dir, image.vertical_flip(0.5)).permute(0, 3, 1, 2)
    flipped = [torch.equal(s, F.vertical_flip(p)) for s, p in zip(sometimes, plain)]
    assert all(f or torch.equal(s, p) for f, s, p in zip(flipped, sometimes, plain))
    assert 0 < sum(flipped) < len(flipped)  # both branches taken with this seed


@pytest.mark.parametrize("mean,std", [((0.5, 0.25, 0.75), (0.2, 0.4, 0.3)), ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
                                      (image.IMAGENET_MEAN, image.IMAGENET_STD)])
def test_normalize_with_any_mean_and_std_equals_torchvision(image_dir, mean, std):
    plain = _resized(image_dir).permute(0, 3, 1, 2)
    got = _resized(image_dir, image.normalize(mean, std))
    expected = F.normalize(plain.to(torch.float32) / 255, list(mean), list(std))
    assert got.dtype == torch.float32 and got.shape == expected.shape == (8, 3, 48, 40)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-6 / min(std))
