"""Custom stages are checked when they are declared (the function against ``draws``, the dtype in any common
spelling), are told the size they receive, and an error from inside one names it; the README's example runs at
any size."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from feedline.loader import Loader
from feedline.pipelines import image
from feedline.pipelines.counter_rng import uniform

README = Path(__file__).resolve().parent.parent / "README.md"


def _with_u(images, u):
    return images


def _alone(images):
    return images


@pytest.mark.parametrize("fn, draws, match", [
    (_with_u, 0, r"custom stage '_with_u': with draws=0 its function is called as fn\(images\).*give draws=k"),
    (lambda images, u, extra: images, 2, r"with draws=2 .* does not take two arguments"),
    (_alone, 3, r"custom stage '_alone': with draws=3 .*give draws=0"),
    (lambda *, images: images, 0, "does not take one argument"),
])
def test_a_function_that_cannot_take_the_call_is_refused_when_declared(fn, draws, match):
    with pytest.raises(TypeError, match=match):
        image.custom(fn, draws=draws)


def test_functions_that_fit_are_accepted():
    image.custom(lambda images, u=None: images)                       # draws=0: u has a default
    image.custom(lambda images, *rest: images, draws=2)
    image.custom(lambda images, u, size: images, draws=1)
    image.custom(lambda images, *, size: images)
    image.custom(torch.neg)                                           # a builtin: judged by what it returns


@pytest.mark.parametrize("dtype", ["float32", torch.float32, np.float32, np.dtype("float32")])
def test_torch_and_numpy_dtypes_are_accepted(image_dir, dtype):
    stage = image.custom(lambda x: x.float() / 255, dtype=dtype, name="scale")
    spec = image.pipeline(image_dir, [image.decode(), image.center_crop(16), stage])
    batch = next(iter(Loader(spec, batch_size=2, placement="cpu")))
    assert batch["image"].dtype == torch.float32 and batch["image"].shape == (2, 3, 16, 16)


@pytest.mark.parametrize("dtype", [torch.int64, "float64", np.int16, 3])
def test_other_dtypes_are_refused_naming_the_stage(dtype):
    with pytest.raises(ValueError, match="custom stage 'scale': dtype must be uint8 or float32"):
        image.custom(lambda x: x, dtype=dtype, name="scale")


def test_a_custom_stage_is_told_the_size_it_receives(image_dir):
    seen = []

    def record(images, size):
        seen.append((size, tuple(images.shape[-2:])))
        return images

    spec = image.pipeline(image_dir, [image.decode(), image.resize((24, 40)), image.custom(record),
                                      image.center_crop(16), image.custom(record, name="again")])
    next(iter(Loader(spec, batch_size=3, placement="cpu")))
    assert set(seen) == {((24, 40), (24, 40)), ((16, 16), (16, 16))}  # (batches are made ahead too)


def test_an_error_inside_a_custom_stage_names_it(image_dir):
    def broken(images):
        return images + torch.zeros(5)  # a shape error, as a user's own code makes them

    spec = image.pipeline(image_dir, [image.decode(), image.center_crop(16), image.custom(broken, name="cutout")])
    with pytest.raises(RuntimeError) as info:
        list(Loader(spec, batch_size=2, placement="cpu"))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "in image stage 'cutout'" in notes and "(2, 3, 16, 16)" in notes, notes


def _readme_cutout():
    text = README.read_text()
    code = re.search(r"^def cutout\(.*?\n(?=\n)", text, re.S | re.M).group(0)
    scope = {"torch": torch}
    exec(code, scope)  # noqa: S102  (the README's own example, checked)
    return scope["cutout"]


@pytest.mark.parametrize("size", [48, (40, 64)])
def test_the_readmes_cutout_runs_at_any_size(image_dir, size):
    """The README's example, at sizes other than 224: each sample's hole is where its own uniforms put it."""
    cutout = _readme_cutout()
    spec = image.pipeline(image_dir, [image.decode(), image.resize(size), image.custom(cutout, draws=2)]) \
        if isinstance(size, tuple) else image.pipeline(image_dir, [image.decode(), image.random_resized_crop(size),
                                                                  image.custom(cutout, draws=2)])
    plain = image.pipeline(image_dir, [*spec.stages[1:3]])
    loader = Loader(spec, batch_size=4, placement="cpu", seed=2, shuffle=False)
    batch = next(iter(loader))
    reference = next(iter(Loader(plain, batch_size=4, placement="cpu", seed=2, shuffle=False)))["image"]
    height, width = batch["image"].shape[1:3]
    offset = sum(s.draws for s in spec.stages[1:-1])  # the draws of the stages before it
    u = uniform(2, 0, batch["index"].numpy(), offset + 2)[:, offset:]
    for k in range(4):
        y, x = int(u[k, 0] * height), int(u[k, 1] * width)
        rows = np.abs(np.arange(height) - y) < height // 8
        cols = np.abs(np.arange(width) - x) < width // 8
        hole = rows[:, None] & cols[None, :]
        got, ref = batch["image"][k].numpy(), reference[k].numpy()
        assert hole.any() and not got[hole].any()
        assert np.array_equal(got[~hole], ref[~hole])
