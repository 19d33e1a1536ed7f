"""The color_jitter, grayscale and rotate stages against torchvision.transforms.v2 (its functional ops, and its
transforms' ``transform`` given the same parameters), computed independently on the same images.

Tolerance: exact equality, everywhere. Each stage does torchvision's float32 arithmetic operation for operation
(the same products, fused multiply-adds, floors, mean, truncations; for rotate the same float32 grid from one
``bmm`` and the same ``grid_sample``) on the same device, so the uint8 results are bit-identical. Measured on
the images below and on all 2**24 colours: max difference 0, share of differing values 0. Any tolerance would
hide what this guards against; measured alternatives that are equal in exact arithmetic:
- luma without the fused multiply-adds: 21 of the 2**24 colours one level off (grayscale, and the
  grey that contrast and saturation blend with);
- saturation's blend as two rounded products: one level off on 0.6% of values;
- hue with other equivalent formulas (dividing by 255 and 6 rather than multiplying by their reciprocals,
  ``t = v (1 - s (1 - f))``): one level off on 5e-6 of values;
- the rotation grid in float64 instead of torchvision's float32 ``bmm``: nearest-neighbour ties (source points
  exactly half-way between pixels) go the other way on up to 9% of pixels for 90-degree turns of non-square
  images (20x33, 64x47, 100x151; none for 21x34), and on ~1e-5 of pixels at other angles.
"""
import itertools
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from torchvision.transforms import InterpolationMode, v2

from feedline.pipelines.imaging.color_jitter import ColorJitter
from feedline.pipelines.imaging.grayscale import Grayscale
from feedline.pipelines.imaging.rotate import Rotate
from feedline.pipelines.imaging.types import Dtype, ImageType

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]  # skipped only where there is no GPU (conftest)
SIZES = [(1, 1), (1, 9), (8, 1), (2, 2), (3, 5), (7, 7), (16, 16), (31, 17), (64, 63), (227, 301)]


def _images(seed: int, count: int = 40, device: str = "cpu"):
    """uint8 CHW images of the fixed odd and tiny sizes and of random ones; value ranges from full noise to
    a few levels (many equal channels: hue's ties and grey pixels) and a grey image; half of them as the
    runner gives them (a CHW view of HWC memory)."""
    rng = np.random.default_rng(seed)
    sizes = SIZES + [(int(rng.integers(1, 90)), int(rng.integers(1, 90))) for _ in range(count - len(SIZES))]
    out = []
    for i, (h, w) in enumerate(sizes):
        top = (256, 256, 4, 40)[i % 4]
        hwc = rng.integers(0, top, (h, w, 3), dtype=np.uint8) + np.uint8(rng.integers(0, 256 - top + 1))
        if i == 5:
            hwc[...] = hwc[..., :1]  # grey: no hue, no saturation
        image = torch.from_numpy(hwc).to(device).permute(2, 0, 1)
        out.append(image if i % 2 else image.contiguous())
    return out


def _assert_same(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    assert ours.dtype == torch.uint8 and ours.shape == theirs.shape, what
    diff = (ours.int() - theirs.int()).abs()
    assert torch.equal(ours, theirs), (f"{what}: {int((diff > 0).sum())} of {diff.numel()} values differ, "
                                       f"max by {int(diff.max())}")


def _one(which: str) -> ColorJitter:
    """A jitter with only one adjustment applied; its factor comes from the params given to ``torch``."""
    return ColorJitter(**{which: 0.5 if which == "hue" else 1.0})


FUNCTIONAL = {"brightness": TF.adjust_brightness, "contrast": TF.adjust_contrast,
              "saturation": TF.adjust_saturation, "hue": TF.adjust_hue}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["brightness", "contrast", "saturation", "hue"])
def test_each_adjustment_equals_torchvision(which, device):
    stage = _one(which)
    k = ("brightness", "contrast", "saturation", "hue").index(which)
    rng = np.random.default_rng(1 + k)
    for n, image in enumerate(_images(10 + k, device=device)):
        # Factors across the useful range, with the identity and the extremes among them.
        specials = [0.0, 0.5, -0.5, 1e-7] if which == "hue" else [0.0, 1.0, 2.5, 1e-7]
        factor = specials[n] if n < len(specials) else (
            float(rng.uniform(-0.5, 0.5)) if which == "hue" else float(rng.uniform(0.0, 2.0)))
        factors = np.array([1.0, 1.0, 1.0, 0.0])
        factors[k] = factor
        ours = stage.torch(image, {"order": np.array([3, 2, 1, 0]), "factors": factors})
        _assert_same(ours, FUNCTIONAL[which](image, factor), f"{which} {factor} on {tuple(image.shape)}")


@pytest.mark.parametrize("device", DEVICES)
def test_grayscale_equals_torchvision(device):
    stage = Grayscale()
    for image in _images(20, device=device):
        _assert_same(stage.torch(image, {"gray": np.True_}), TF.rgb_to_grayscale(image, num_output_channels=3),
                     f"grayscale on {tuple(image.shape)}")
        assert stage.torch(image, {"gray": np.False_}) is image


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_rotate_equals_torchvision(interpolation, device):
    stage = Rotate(180, interpolation=interpolation)
    mode = InterpolationMode.NEAREST if interpolation == "nearest" else InterpolationMode.BILINEAR
    rng = np.random.default_rng(3)
    # The angles torchvision turns without resampling (on square images for 90 and 270), their neighbours,
    # angles outside [0, 360) and random ones.
    specials = [0.0, -0.0, 90.0, 180.0, 270.0, -90.0, 360.0, 450.0, 45.0, 89.999, -180.0, 1e-9, 720.5]
    for n, image in enumerate(_images(30, device=device) + _images(31, count=20, device=device)):
        angle = specials[n] if n < len(specials) else float(rng.uniform(-180.0, 180.0))
        square = image[:, :image.shape[1], :image.shape[1]] if image.shape[2] >= image.shape[1] else image
        for img in (image, square):
            _assert_same(stage.torch(img, {"angle": np.float64(angle)}), TF.rotate(img, angle, mode, fill=0),
                         f"rotate {angle} on {tuple(img.shape)}")
    # Quarter turns of non-square images resample, with many source points exactly half-way between pixels.
    for (h, w), angle in itertools.product([(20, 33), (64, 47), (21, 34), (100, 151)], [90.0, -90.0, 270.0, 90.001]):
        image = torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8)).to(device)
        _assert_same(stage.torch(image, {"angle": np.float64(angle)}), TF.rotate(image, angle, mode, fill=0),
                     f"rotate {angle} on {(h, w)}")


@pytest.mark.slow
def test_every_colour_equals_torchvision():
    """All 2**24 RGB colours once: grayscale, brightness, saturation and hue act on each pixel alone, so this
    checks them on every input there is (luma computed without torchvision's fused multiply-adds, for one,
    truncates differently for 21 of these colours, and random images would not meet them)."""
    v = torch.arange(1 << 24, dtype=torch.int32)
    colours = torch.stack(((v >> 16) & 255, (v >> 8) & 255, v & 255)).to(torch.uint8).view(3, 4096, 4096)
    factors = np.array([1.0, 1.0, 1.0, 0.0])
    for part in colours.split(1024, dim=1):  # a quarter at a time, to keep the float32 temporaries small
        _assert_same(Grayscale().torch(part, {"gray": True}), TF.rgb_to_grayscale(part, 3), "grayscale")
        for k, factor in ((0, 1.37), (2, 0.61), (3, 0.137), (3, -0.42)):
            which = ("brightness", "contrast", "saturation", "hue")[k]
            params = {"order": np.arange(4), "factors": np.where(np.arange(4) == k, factor, factors)}
            _assert_same(_one(which).torch(part, params), FUNCTIONAL[which](part, factor), f"{which} {factor}")


def _torchvision_jitter(jitter: v2.ColorJitter, image, order, factors) -> torch.Tensor:
    """torchvision's own ColorJitter with our order and factors (None where it skips an adjustment)."""
    names = ("brightness", "contrast", "saturation", "hue")
    params = {f"{name}_factor": None if getattr(jitter, name) is None else float(f)
              for name, f in zip(names, factors)}
    return jitter.transform(image, dict(params, fn_idx=torch.from_numpy(order)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("args", [(0.4, 0.4, 0.4, 0.1), (0.8, (0.5, 1.5), 0.0, (-0.5, 0.5)), (0.0, 0.0, 2.0, 0.0),
                                  ((0.2, 0.2), 0, 0, 0.5)])
def test_color_jitter_composition_equals_torchvision(args, device):
    stage = ColorJitter(*args)
    jitter = v2.ColorJitter(*args)
    # Our ranges and skips are torchvision's _check_input's.
    for ours, theirs in zip(stage.ranges, (jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue)):
        assert (theirs is None and ours[0] == ours[1] and ours[0] in (0.0, 1.0)) or ours == tuple(theirs)
    images = _images(40, device=device)
    u = np.random.default_rng(4).random((len(images), stage.draws))
    params, _ = stage.sample(u, np.zeros((len(images), 2), np.int64))
    for i, image in enumerate(images):
        order, factors = params["order"][i], params["factors"][i]
        ours = stage.torch(image, {"order": order, "factors": factors})
        _assert_same(ours, _torchvision_jitter(jitter, image, order, factors), f"{args}, order {order}")
        # The functional ops in that order, skipping those torchvision's class skips.
        expected = image
        for k in order:
            if stage.applied[k]:
                expected = list(FUNCTIONAL.values())[k](expected, float(factors[k]))
        _assert_same(ours, expected, f"{args}, order {order}, functional")


def test_order_matters():
    """The order is applied, not a fixed one: contrast after brightness differs from brightness after contrast
    (a check that the tests above can tell orders apart)."""
    stage = ColorJitter(brightness=0.9, contrast=0.9)
    image = _images(5)[9]
    factors = np.array([1.7, 0.3, 1.0, 0.0])
    a = stage.torch(image, {"order": np.array([0, 1, 2, 3]), "factors": factors})
    b = stage.torch(image, {"order": np.array([1, 0, 2, 3]), "factors": factors})
    assert not torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_grayscale_and_rotation_transforms_equal_torchvision(device):
    """The stages against the v2 transform classes given the same parameters."""
    images = _images(50, count=20, device=device)
    u = np.random.default_rng(5).random((len(images), 1))
    sizes = np.zeros((len(images), 2), np.int64)
    gray, _ = Grayscale(0.5).sample(u, sizes)
    rot = Rotate(40)
    angles, _ = rot.sample(u, sizes)
    assert v2.RandomRotation(40).degrees == list(rot.degrees)
    for i, image in enumerate(images):
        expected = v2.RandomGrayscale(0.5).transform(image, {"num_input_channels": 3}) if gray["gray"][i] else image
        _assert_same(Grayscale(0.5).torch(image, {"gray": gray["gray"][i]}), expected, "grayscale")
        _assert_same(rot.torch(image, {"angle": angles["angle"][i]}),
                     v2.RandomRotation(40).transform(image, {"angle": float(angles["angle"][i])}), "rotation")


# sample()

def test_color_jitter_ranges_follow_torchvision():
    assert ColorJitter(0.4, 0.4, 0.4, 0.1).ranges == ((0.6, 1.4), (0.6, 1.4), (0.6, 1.4), (-0.1, 0.1))
    assert ColorJitter(brightness=2).ranges[0] == (0.0, 3.0)  # the lower end clipped at 0
    assert ColorJitter(contrast=(0, 5), hue=(-0.5, 0.2)).ranges[1:4:2] == ((0.0, 5.0), (-0.5, 0.2))
    assert ColorJitter().applied == (False, False, False, False)
    assert ColorJitter(saturation=0.3, hue=0.5).applied == (False, False, True, True)
    # A range of one value that is not the identity still applies; only the identity is skipped.
    assert ColorJitter(brightness=(0.5, 0.5), contrast=(1, 1), hue=(0.0, 0.0)).applied == (True, False, False, False)


def test_color_jitter_sample():
    stage = ColorJitter(0.4, (0.2, 1.0), 0.0, 0.3)
    u = np.random.default_rng(6).random((24_000, 8))
    sizes = np.random.default_rng(7).integers(1, 500, (24_000, 2))
    params, sizes_out = stage.sample(u, sizes)
    assert sizes_out is sizes
    order, factors = params["order"], params["factors"]
    assert order.dtype == np.int64 and order.shape == (24_000, 4)
    assert factors.dtype == np.float64 and factors.shape == (24_000, 4)
    assert (np.sort(order, axis=1) == np.arange(4)).all()  # each row a permutation
    # Uniformly random: each of the 24 orders about 1000 times (sd ~31; bounds at 5 sd).
    counts = {}
    for row in map(tuple, order):
        counts[row] = counts.get(row, 0) + 1
    assert len(counts) == 24 and min(counts.values()) > 840 and max(counts.values()) < 1160, counts
    for k, span in enumerate([(0.6, 1.4), (0.2, 1.0), None, (-0.3, 0.3)]):
        if span is None:
            assert (factors[:, k] == 1.0).all()  # skipped saturation: the identity, never applied
            continue
        lo, hi = span
        assert (factors[:, k] >= lo).all() and (factors[:, k] < hi).all()
        # Spread over the whole range, from its own uniform.
        assert factors[:, k].min() < lo + 0.001 * (hi - lo) and factors[:, k].max() > hi - 0.001 * (hi - lo)
        np.testing.assert_allclose(factors[:, k], lo + (hi - lo) * u[:, 4 + k], rtol=0, atol=1e-12)
    again, _ = stage.sample(u.copy(), sizes)
    assert all(np.array_equal(params[key], again[key]) for key in params)
    first, _ = stage.sample(u[:10], sizes[:10])
    assert all(np.array_equal(params[key][:10], first[key]) for key in params)  # per sample, not per batch


def test_skipped_adjustment_is_never_applied():
    """With only hue in the stage, a brightness factor in the params (however it got there) changes nothing."""
    stage = ColorJitter(hue=0.2)
    image = _images(8)[6]
    ours = stage.torch(image, {"order": np.array([0, 3, 1, 2]), "factors": np.array([3.0, 0.2, 0.0, 0.1])})
    _assert_same(ours, TF.adjust_hue(image, 0.1), "hue only")


def test_grayscale_sample():
    u = np.random.default_rng(8).random((10_000, 1))
    sizes = np.ones((10_000, 2), np.int64)
    assert not Grayscale(0.0).sample(u, sizes)[0]["gray"].any()
    assert Grayscale(1.0).sample(u, sizes)[0]["gray"].all()
    assert Grayscale().p == 1.0
    gray = Grayscale(0.3).sample(u, sizes)[0]["gray"]
    assert np.array_equal(gray, u[:, 0] < 0.3) and abs(gray.mean() - 0.3) < 0.02
    assert np.array_equal(Grayscale(1.0).sample(np.zeros((1, 1)), sizes[:1])[0]["gray"], [True])
    assert np.array_equal(Grayscale(0.0).sample(np.zeros((1, 1)), sizes[:1])[0]["gray"], [False])


def test_rotate_sample():
    u = np.random.default_rng(9).random((10_000, 1))
    sizes = np.ones((10_000, 2), np.int64)
    assert Rotate(30).degrees == (-30.0, 30.0)
    angle = Rotate(30).sample(u, sizes)[0]["angle"]
    assert angle.min() >= -30 and angle.max() < 30 and angle.min() < -29.9 and angle.max() > 29.9
    np.testing.assert_array_equal(angle, Rotate(30).sample(u.copy(), sizes)[0]["angle"])
    angle = Rotate((10, 20)).sample(u, sizes)[0]["angle"]
    np.testing.assert_allclose(angle, 10 + 10 * u[:, 0], rtol=0, atol=1e-12)
    assert (Rotate((90, 90)).sample(u, sizes)[0]["angle"] == 90).all()


# torch_batch equals torch per image

def _per_image(stage, images, params):
    return torch.stack([stage.torch(images[i], {k: v[i] for k, v in params.items()})
                        for i in range(images.shape[0])])


def _batch(seed: int, n: int, h: int, w: int, channels_last: bool):
    rng = np.random.default_rng(seed)
    nhwc = torch.from_numpy(rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8))
    nhwc[: n // 3] //= 16  # a third with few levels: ties between channels
    images = nhwc.permute(0, 3, 1, 2)
    return images if channels_last else images.contiguous()


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("hw", [(13, 17), (32, 32), (1, 5)])
def test_color_jitter_batch_equals_per_image(hw, channels_last):
    images = _batch(10, 12, *hw, channels_last)
    before = images.clone()
    for args in [(0.5, 0.5, 0.5, 0.2), (0.5, 0, 0, 0.2), (0, 0.5, 0.5, 0)]:
        stage = ColorJitter(*args)
        u = np.random.default_rng(11).random((12, 8))
        for same_order in (False, True):  # one order for all: the whole-batch path
            if same_order:
                u[:, :4] = u[0, :4]
            params, _ = stage.sample(u, np.zeros((12, 2), np.int64))
            _assert_same(stage.torch_batch(images, params), _per_image(stage, images, params), f"{args}")
    assert torch.equal(images, before)  # the input is left as it was


@pytest.mark.parametrize("channels_last", [True, False])
def test_grayscale_batch_equals_per_image(channels_last):
    images = _batch(12, 10, 19, 23, channels_last)
    for p in (0.0, 0.5, 1.0):
        stage = Grayscale(p)
        params, _ = stage.sample(np.random.default_rng(13).random((10, 1)), np.zeros((10, 2), np.int64))
        _assert_same(stage.torch_batch(images, params), _per_image(stage, images, params), f"p={p}")


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("hw", [(21, 21), (20, 33), (1, 4)])
@pytest.mark.parametrize("channels_last", [True, False])
def test_rotate_batch_equals_per_image(hw, interpolation, channels_last):
    images = _batch(14, 10, *hw, channels_last)
    stage = Rotate(180, interpolation=interpolation)
    random = {"angle": stage.sample(np.random.default_rng(15).random((10, 1)), np.zeros((10, 2), np.int64))[0]["angle"]}
    mixed = {"angle": np.array([0.0, 90.0, 33.3, 180.0, -90.0, 270.0, 12.5, 360.0, -0.0, 91.0])}
    for params in (random, mixed):
        _assert_same(stage.torch_batch(images, params), _per_image(stage, images, params), f"{params}")


# Arguments and types

@pytest.mark.parametrize("kwargs, error, match", [
    ({"brightness": -0.1}, ValueError, r"color_jitter: brightness .* got -0\.1"),
    ({"contrast": (-0.5, 1.0)}, ValueError, r"color_jitter: contrast .* got \(-0\.5, 1\.0\)"),
    ({"saturation": (1.5, 0.5)}, ValueError, r"color_jitter: saturation .*min <= max.* got \(1\.5, 0\.5\)"),
    ({"hue": 0.6}, ValueError, r"color_jitter: hue .*\[0, 0\.5\], got 0\.6"),
    ({"hue": -0.1}, ValueError, r"color_jitter: hue .* got -0\.1"),
    ({"hue": (-0.6, 0.1)}, ValueError, r"color_jitter: hue .* got \(-0\.6, 0\.1\)"),
    ({"brightness": "0.4"}, TypeError, r"color_jitter: brightness .* got '0\.4'"),
    ({"contrast": (0.5, 1.0, 1.5)}, TypeError, r"color_jitter: contrast .* got \(0\.5, 1\.0, 1\.5\)"),
    ({"saturation": math.nan}, TypeError, r"color_jitter: saturation .* got nan"),
    ({"brightness": True}, TypeError, r"color_jitter: brightness .* got True"),
    ({"name": "a b"}, ValueError, r"color_jitter: name"),
])
def test_color_jitter_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        ColorJitter(**kwargs)


@pytest.mark.parametrize("p", [1.5, -0.1, True, "0.5", None])
def test_grayscale_arguments(p):
    with pytest.raises(ValueError, match=r"grayscale: p must be a number in \[0, 1\], got"):
        Grayscale(p)


@pytest.mark.parametrize("kwargs, match", [
    ({"degrees": -5}, r"rotate: degrees .* got -5"),
    ({"degrees": (10, -10)}, r"rotate: degrees .*min <= max.* got \(10, -10\)"),
    ({"degrees": "30"}, r"rotate: degrees .* got '30'"),
    ({"degrees": math.inf}, r"rotate: degrees .* got inf"),
    ({"degrees": (0, math.nan)}, r"rotate: degrees .* got \(0, nan\)"),
    ({"degrees": 10, "interpolation": "bicubic"}, r"rotate: interpolation .* got 'bicubic'"),
])
def test_rotate_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Rotate(**kwargs)


def test_positional_fields_match_the_factories():
    assert ColorJitter(0.1, 0.2, 0.3, 0.4, "cj").ranges == ((0.9, 1.1), (0.8, 1.2), (0.7, 1.3), (-0.4, 0.4))
    assert ColorJitter(0.1, 0.2, 0.3, 0.4, "cj").name == "cj"
    assert (Grayscale(0.25, "g").p, Grayscale(0.25, "g").name) == (0.25, "g")
    assert (Rotate(15, "r").degrees, Rotate(15, "r").name, Rotate(15, "r").interpolation) == ((-15.0, 15.0), "r",
                                                                                             "nearest")
    assert ColorJitter().name == "color_jitter" and Grayscale().name == "grayscale" and Rotate(1).name == "rotate"
    assert (ColorJitter.draws, Grayscale.draws, Rotate.draws) == (8, 1, 1)
    assert not any(s.has_dali for s in (ColorJitter(), Grayscale(), Rotate(1)))


@pytest.mark.parametrize("stage", [ColorJitter(0.2), Grayscale(), Rotate(10)], ids=lambda s: s.name)
def test_output_type(stage):
    rgb = ImageType(Dtype.UINT8, 3, (20, 30))
    assert stage.output_type(rgb) == rgb
    assert stage.output_type(ImageType(Dtype.UINT8, 3, None)) == ImageType(Dtype.UINT8, 3, None)
    with pytest.raises(TypeError, match=rf"stage {stage.name!r} .*uint8 images, but its input is float32.*before "
                                        r"normalize"):
        stage.output_type(ImageType(Dtype.FLOAT32, 3, (20, 30)))
    gray = ImageType(Dtype.UINT8, 1, (20, 30))
    if isinstance(stage, Rotate):
        assert stage.output_type(gray) == gray  # rotation does not care about channels
    else:
        with pytest.raises(ValueError, match=rf"stage {stage.name!r} .*3 channels.*1 channels"):
            stage.output_type(gray)


def test_describe():
    assert ColorJitter(0.4, 0, 0, 0.1).describe() == "jitter brightness [0.6, 1.4], hue [-0.1, 0.1] in random order"
    assert Grayscale(0.2).describe() == "to grayscale with probability 0.2"
    assert Rotate(30).describe() == "rotate by an angle in [-30, 30] degrees, nearest"


def test_library_does_not_import_torchvision():
    code = ("import sys\n"
            "import feedline.pipelines.imaging.color_jitter, feedline.pipelines.imaging.grayscale\n"
            "import feedline.pipelines.imaging.rotate\n"
            "assert 'torchvision' not in sys.modules, 'torchvision imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_all_orders_reach_the_ops():
    """Every one of the 24 orders gives torchvision's result for that order (on one image)."""
    stage = ColorJitter(0.6, 0.6, 0.6, 0.25)
    jitter = v2.ColorJitter(0.6, 0.6, 0.6, 0.25)
    image = _images(16)[8]
    factors = np.array([1.3, 0.6, 1.8, -0.2])
    results = set()
    for order in itertools.permutations(range(4)):
        order = np.array(order, dtype=np.int64)
        ours = stage.torch(image, {"order": order, "factors": factors})
        _assert_same(ours, _torchvision_jitter(jitter, image, order, factors), f"order {order}")
        results.add(ours.numpy().tobytes())
    assert len(results) > 12  # orders do change the result
