"""Moving a batch: every array of a nested structure (dicts, tuples, named tuples, Jagged) in one contiguous host
buffer, copied once, and viewed again on the other side. Arrays that were written into the buffer in the first
place (``layout_in``) are not copied again; others are packed into one (``pack``)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ... import ops

ALIGN = 16


def _leaves(obj, out: list) -> Any:
    """``obj`` with every array (any leaf of dicts, tuples and Jagged) replaced by its position in ``out``."""
    if isinstance(obj, dict):
        return {k: _leaves(v, out) for k, v in obj.items()}
    if isinstance(obj, ops.Jagged):
        return ("jagged", _leaves(obj.values, out), _leaves(obj.lengths, out), _leaves(obj.offsets, out))
    if isinstance(obj, tuple):
        return (type(obj), tuple(_leaves(v, out) for v in obj))
    out.append(obj)
    return len(out) - 1


def _rebuild(shape, arrays: list) -> Any:
    if isinstance(shape, int):
        return arrays[shape]
    if isinstance(shape, dict):
        return {k: _rebuild(v, arrays) for k, v in shape.items()}
    if shape[0] == "jagged":
        return ops.Jagged(*(arrays[i] for i in shape[1:]))
    kind, items = shape
    items = [_rebuild(v, arrays) for v in items]
    return kind(*items) if kind is not tuple else tuple(items)


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def pack(data: dict, allocate: Callable[[int], np.ndarray] | None = None) -> tuple[np.ndarray, tuple]:
    """One uint8 buffer (``allocate(nbytes)``, default ``np.empty``) holding every array of ``data``, and the
    layout ``unpack`` needs to view them again."""
    arrays: list[np.ndarray] = []
    shape = _leaves(data, arrays)
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += aligned(a.nbytes)
    total = max(total, ALIGN)
    buffer = np.empty(total, dtype=np.uint8) if allocate is None else allocate(total)
    for a, offset in zip(arrays, offsets):
        buffer[offset:offset + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return buffer, (shape, [(o, a.dtype, a.shape) for o, a in zip(offsets, arrays)])


def layout_in(buffer: np.ndarray, data: dict) -> tuple | None:
    """The layout of ``data`` if every array in it is a C-contiguous NumPy array lying inside ``buffer`` (as
    views handed out by the runner), else None."""
    arrays: list = []
    shape = _leaves(data, arrays)
    start = buffer.__array_interface__["data"][0]
    leaves = []
    for a in arrays:
        if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
            return None
        offset = a.__array_interface__["data"][0] - start if a.size else 0
        if offset < 0 or offset + a.nbytes > buffer.nbytes:
            return None
        leaves.append((offset, a.dtype, a.shape))
    return shape, leaves


def unpack(buffer, layout: tuple, view: Callable) -> Any:
    """``data`` again, each array a ``view`` (``torch_view`` or ``cupy_view``) of ``buffer`` wherever it now is."""
    shape, leaves = layout
    arrays = [view(buffer, offset, dtype, dims) for offset, dtype, dims in leaves]
    return _rebuild(shape, arrays)


def cupy_view(buffer, offset: int, dtype: np.dtype, dims: tuple):
    nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    return buffer[offset:offset + nbytes].view(dtype).reshape(dims)


_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.int64): torch.int64,
                 np.dtype(np.int32): torch.int32, np.dtype(np.bool_): torch.bool, np.dtype(np.float64): torch.float64}


def torch_view(buffer: torch.Tensor, offset: int, dtype: np.dtype, dims: tuple):
    nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    return buffer[offset:offset + nbytes].view(_TORCH_DTYPES[dtype]).reshape(dims)


def convert(data, each: Callable):
    """``data`` with ``each`` applied to every array in it (NumPy or CuPy to torch, say)."""
    arrays: list = []
    shape = _leaves(data, arrays)
    return _rebuild(shape, [each(a) for a in arrays])


def plain(data: dict, names: tuple[str, ...]) -> dict[str, Any]:
    """The named outputs, a Jagged becoming a dict of its three arrays."""
    return {name: ({"values": data[name].values, "lengths": data[name].lengths, "offsets": data[name].offsets}
                   if isinstance(data[name], ops.Jagged) else data[name]) for name in names}
