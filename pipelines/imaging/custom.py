"""A user's own function on a batch of images, placed like any other stage, and checked when it is declared."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..stage import Backend, parse_backends
from ..validate import flag, int_in
from .base import ImageStage, fixed_size
from .checks import name as check_name
from .checks import size_pair
from .types import Dtype, ImageType

_DTYPES = {torch.uint8: Dtype.UINT8, torch.float32: Dtype.FLOAT32,
           np.dtype(np.uint8): Dtype.UINT8, np.dtype(np.float32): Dtype.FLOAT32}


def parse_dtype(owner: str, value: object) -> Dtype:
    """``"uint8"``/``"float32"``, ``torch.uint8``/``torch.float32``, the NumPy ones, or a Dtype."""
    if isinstance(value, Dtype):
        return value
    if isinstance(value, str):
        try:
            return Dtype(value)
        except ValueError:
            pass
    else:
        try:
            key = value if isinstance(value, torch.dtype) else np.dtype(value)
            if key in _DTYPES:
                return _DTYPES[key]
        except TypeError:
            pass
    raise ValueError(f"{owner}: dtype must be uint8 or float32 ('uint8', torch.uint8, np.uint8, ...), got {value!r}")


@dataclass(frozen=True)
class Custom(ImageStage):
    """``fn(images)`` or, with ``draws > 0``, ``fn(images, u)``: ``images`` is an ``NCHW`` torch tensor of one
    size on the device the stage is placed on (uint8 images are a channels-last view; float32 ones are
    contiguous), ``u`` a float64 tensor ``[N, draws]`` of the sample's own uniforms from the counter-based
    stream (so the randomness is the same on every placement). A function with a parameter named ``size`` is
    also given ``size=(height, width)``, the size of the images it receives. It returns an ``NCHW`` tensor of
    the declared type: the input's dtype and size unless ``dtype`` or ``size`` say otherwise.

    The function's parameters are checked against that call when the stage is declared."""

    fn: Callable
    backends: frozenset = frozenset({Backend.CPU, Backend.GPU})
    name: str = "custom"
    draws: int = 0
    dtype: Dtype | str | torch.dtype | None = None
    size: int | tuple[int, int] | None = None
    deterministic: bool = False  # True: the same images in give the same images out (it may then be cached)
    needs_batch = True

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"custom: fn must be callable (a function of a batch of torch tensors), got "
                            f"{type(self.fn).__name__}")
        name = self.name if self.name != "custom" else getattr(self.fn, "__name__", "custom")
        object.__setattr__(self, "name", check_name("custom", name if name.isidentifier() else "custom"))
        owner = f"custom stage {self.name!r}"
        object.__setattr__(self, "backends", parse_backends(owner, self.backends))
        object.__setattr__(self, "draws", int_in(f"{owner}: draws", self.draws, 0, 64))
        object.__setattr__(self, "deterministic", flag(f"{owner}: deterministic", self.deterministic))
        if self.dtype is not None:
            object.__setattr__(self, "dtype", parse_dtype(owner, self.dtype))
        if self.size is not None:
            object.__setattr__(self, "size", size_pair(owner, "size", self.size))
        object.__setattr__(self, "_takes_size", self._check_signature(owner))

    def _check_signature(self, owner: str) -> bool:
        """Whether ``fn`` takes ``size=``; a TypeError now where it cannot be called as the stage will call it."""
        try:
            signature = inspect.signature(self.fn)
        except (TypeError, ValueError):
            return False  # a builtin without a signature: it is called and judged by what it returns
        sized = signature.parameters.get("size")
        takes_size = sized is not None and sized.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                          inspect.Parameter.KEYWORD_ONLY)
        call = "fn(images, u" if self.draws else "fn(images"
        call += ", size=(height, width))" if takes_size else ")"
        try:
            signature.bind(*([None] * (2 if self.draws else 1)), **({"size": None} if takes_size else {}))
        except TypeError as exc:
            hint = (f"; give draws=k (k uniforms per sample) for a function of (images, u)"
                    if not self.draws else f"; give draws=0 for a function of images alone")
            arguments = "two arguments" if self.draws else "one argument"
            raise TypeError(f"{owner}: with draws={self.draws} its function is called as {call}, but "
                            f"{getattr(self.fn, '__qualname__', self.fn)}{signature} does not take {arguments} "
                            f"that way ({exc}){hint}") from None
        return takes_size

    def output_type(self, image: ImageType) -> ImageType:
        fixed_size(self.name, image, "runs on a batch")
        return ImageType(self.dtype or image.dtype, image.channels, self.size or image.size)

    def sample(self, u, sizes):
        params = {"u": u} if self.draws else {}
        if self.size is not None:
            sizes = np.tile(np.array([self.size[1], self.size[0]], dtype=np.int64), (sizes.shape[0], 1))
        return params, sizes

    def torch_batch(self, images, params):
        args = (images, torch.from_numpy(params["u"]).to(images.device)) if self.draws else (images,)
        if self._takes_size:
            return self.fn(*args, size=(int(images.shape[-2]), int(images.shape[-1])))
        return self.fn(*args)

    def describe(self) -> str:
        return f"custom: {getattr(self.fn, '__qualname__', repr(self.fn))}"
