"""A user's own function on a batch of images, placed like any other stage."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..stage import Backend, parse_backends
from .base import ImageStage, fixed_size
from .checks import name as check_name
from .checks import size_pair
from .types import Dtype, ImageType


@dataclass(frozen=True)
class Custom(ImageStage):
    """``fn(images)`` or, with ``draws > 0``, ``fn(images, u)``: ``images`` is an ``NCHW`` torch tensor of one
    size on the device the stage is placed on (uint8 images are a channels-last view; float32 ones are
    contiguous), ``u`` a float64 tensor ``[N, draws]`` of the sample's own uniforms from the counter-based
    stream (so the randomness is the same on every placement). It returns an ``NCHW`` tensor of the declared
    type: the input's dtype and size unless ``dtype`` or ``size`` say otherwise."""

    fn: Callable
    backends: frozenset = frozenset({Backend.CPU, Backend.GPU})
    name: str = "custom"
    draws: int = 0
    dtype: Dtype | str | None = None
    size: int | tuple[int, int] | None = None
    needs_batch = True

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"custom: fn must be callable (a function of a batch of torch tensors), got "
                            f"{type(self.fn).__name__}")
        name = self.name if self.name != "custom" else getattr(self.fn, "__name__", "custom")
        object.__setattr__(self, "name", check_name("custom", name if name.isidentifier() else "custom"))
        object.__setattr__(self, "backends", parse_backends(f"custom stage {self.name!r}", self.backends))
        if isinstance(self.draws, bool) or not isinstance(self.draws, int) or not 0 <= self.draws <= 64:
            raise ValueError(f"custom stage {self.name!r}: draws must be an integer in [0, 64], got {self.draws!r}")
        if self.dtype is not None:
            try:
                object.__setattr__(self, "dtype", Dtype(self.dtype) if not isinstance(self.dtype, Dtype) else self.dtype)
            except ValueError:
                raise ValueError(f"custom stage {self.name!r}: dtype must be 'uint8' or 'float32', "
                                 f"got {self.dtype!r}") from None
        if self.size is not None:
            object.__setattr__(self, "size", size_pair(f"custom stage {self.name!r}", "size", self.size))
        if self.draws:
            try:
                inspect.signature(self.fn).bind(None, None)
            except TypeError:
                raise TypeError(f"custom stage {self.name!r} declares draws={self.draws}, so fn is called as "
                                f"fn(images, u); {self.fn!r} does not take two arguments") from None
            except ValueError:
                pass  # a builtin without a signature: it is called and judged by what it returns

    def output_type(self, image: ImageType) -> ImageType:
        fixed_size(self.name, image, "runs on a batch")
        return ImageType(self.dtype or image.dtype, image.channels, self.size or image.size)

    def sample(self, u, sizes):
        params = {"u": u} if self.draws else {}
        if self.size is not None:
            sizes = np.tile(np.array([self.size[1], self.size[0]], dtype=np.int64), (sizes.shape[0], 1))
        return params, sizes

    def torch_batch(self, images, params):
        if self.draws:
            return self.fn(images, torch.from_numpy(params["u"]).to(images.device))
        return self.fn(images)

    def describe(self) -> str:
        return f"custom: {getattr(self.fn, '__qualname__', repr(self.fn))}"
