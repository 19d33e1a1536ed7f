"""The crop-window arithmetic against torchvision's own ``RandomResizedCrop.get_params``, given the same draws."""
import numpy as np
import pytest
import torch
import torchvision.transforms.transforms as tv_transforms

from feedline.pipelines import geometry


class SameDraws:
    """Stands in for ``torch`` inside torchvision's ``get_params``: its uniforms and randints come from our
    draws, in the order it asks for them. torch would draw in float32; the draws are handed over in float64 (and
    the ratio bounds computed in float64) so that what is compared is the arithmetic, exactly."""

    def __init__(self, draws):
        self.draws = list(draws)
        self.used = 0

    def _next(self) -> float:
        value = self.draws[self.used]
        self.used += 1
        return value

    def empty(self, *shape):
        outer = self

        class Uniform:
            def uniform_(self, low, high):
                low, high = float(low), float(high)
                return torch.tensor([low + (high - low) * outer._next()], dtype=torch.float64)

        return Uniform()

    def randint(self, low, high, size):
        return torch.tensor([low + int(np.floor(self._next() * (high - low)))])

    def tensor(self, values):
        return torch.tensor(values, dtype=torch.float64)

    log, exp = staticmethod(torch.log), staticmethod(torch.exp)


def torchvision_window(monkeypatch, width, height, u, scale, ratio):
    """torchvision's (x, y, w, h) for an image of ``width`` x ``height``, fed ``u`` (laid out as geometry
    expects: (area, ratio) per attempt, then (y, x)) in the order torchvision draws; and whether it fell back
    to the centre crop (no attempt fitted)."""
    shim = SameDraws([v for k in range(geometry.ATTEMPTS) for v in (u[2 * k], u[2 * k + 1])])
    placed = []

    def randint(low, high, size):  # called only once an attempt fits: y, then x
        value = u[-2] if not placed else u[-1]
        placed.append(value)
        return torch.tensor([low + int(np.floor(value * (high - low)))])

    shim.randint = randint
    monkeypatch.setattr(tv_transforms, "torch", shim)
    i, j, h, w = tv_transforms.RandomResizedCrop.get_params(torch.empty(3, height, width), list(scale), list(ratio))
    return (j, i, w, h), not placed


@pytest.mark.parametrize("scale,ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 1.0), (1.0, 1.0)),
                                         ((0.9, 1.0), (2.0, 3.0)), ((0.01, 0.05), (0.2, 5.0))])
def test_random_resized_crop_windows_equal_torchvision_get_params(monkeypatch, scale, ratio):
    rng = np.random.default_rng(0)
    n = 400
    width = rng.integers(1, 900, n)
    height = rng.integers(1, 900, n)
    height[:40] = width[:40] * 7  # very tall and very wide images, where attempts may all fail
    width[40:80] = height[40:80] * 7
    u = rng.random((n, 2 * geometry.ATTEMPTS + 2))
    ours = geometry.random_resized_crop(width, height, u, scale, ratio)
    for k in range(n):
        expected, _ = torchvision_window(monkeypatch, int(width[k]), int(height[k]), u[k], scale, ratio)
        assert tuple(int(v) for v in ours[k]) == expected, (k, width[k], height[k])


@pytest.mark.parametrize("width,height", [(10, 100), (100, 10), (50, 50)])
def test_the_centre_fallback_equals_torchvision(monkeypatch, width, height):
    """Windows of at least 90% of the area and aspect 2-3 fit no tall image, nor a square one: every attempt
    fails and both fall back to the centre crop of the clamped aspect ratio."""
    u = np.random.default_rng(1).random((1, 2 * geometry.ATTEMPTS + 2))
    scale, ratio = (0.9, 1.0), (2.0, 3.0)
    expected, fell_back = torchvision_window(monkeypatch, width, height, u[0], scale, ratio)
    assert fell_back
    ours = geometry.random_resized_crop(np.array([width]), np.array([height]), u, scale, ratio)
    assert tuple(int(v) for v in ours[0]) == expected
