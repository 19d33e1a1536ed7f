"""Where a feature pipeline's CPU stages write a batch: one buffer per batch (the batch's own tensors on a CPU
placement, reused once the trainer lets go of them; a pinned buffer that crosses to the GPU in one copy
otherwise), laid out per batch size, this thread's scratch for whatever the buffer does not carry, and the
outputs every batch of a size shares, made once.
"""
from __future__ import annotations

import functools
import threading
from typing import Any

import numpy as np
import torch

from ... import ops
from . import transfer
from .buffers import BufferRing, Dressed


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


class BufferLayout:
    """Where each array a batch of ``rows`` rows is written to lies in its one buffer: ``places[name]`` =
    (offset, end, shape, dtype), 16-byte aligned; ``nbytes`` in all."""

    def __init__(self, arrays: dict[str, tuple[tuple[int, ...], np.dtype]]):
        self.places: dict[str, tuple[int, int, tuple[int, ...], np.dtype]] = {}
        offset = 0
        for name, (shape, dtype) in arrays.items():
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            self.places[name] = (offset, offset + nbytes, shape, np.dtype(dtype))
            offset += transfer.aligned(nbytes)
        self.nbytes = max(offset, transfer.ALIGN)

    def views(self, buffer: np.ndarray) -> dict[str, np.ndarray]:
        return {name: buffer[a:b].view(d).reshape(s) for name, (a, b, s, d) in self.places.items()}

    def torch_views(self, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each array's place in the uint8 ``tensor`` as a torch view of it (sharing its storage)."""
        return {name: tensor[a:b].view(_torch_dtype(d)).view(s) for name, (a, b, s, d) in self.places.items()}


class BatchArrays:
    """The arrays of ``cpu_stages`` for batches of each size. ``delivered``: the arrays a batch's buffer
    carries (with ``index`` and ``valid``); ``alias``: an input of the sparse assembly that is all of the sparse
    values (written straight into them), or None; ``ring``: where buffers come from on a CPU placement (None:
    pinned buffers, for a GPU)."""

    def __init__(self, cpu_stages: tuple, delivered: tuple[str, ...], alias: str | None, ring: BufferRing | None):
        self._cpu_stages = cpu_stages
        self._delivered = delivered
        self._alias = alias
        self._ring = ring
        self._layouts: dict[int, tuple[BufferLayout, dict]] = {}
        # Outputs every batch of a size shares (the sparse lengths and offsets of one id per key and row), made
        # once per size, as TorchRec's own loader shares them: they are never written per batch.
        self._shared: dict[int, dict[str, np.ndarray]] = {}
        self._device_shared: dict[int, dict[str, torch.Tensor]] = {}
        self._constant_tensors: dict[int, dict[str, tuple[np.ndarray, torch.Tensor]]] = {}
        self._scratch = threading.local()
        self._parts: dict[str, tuple[tuple[str, str], ...]] = {}  # a Jagged output's parts: (key, "name.key")
        self._asked: dict[int, tuple] = {}  # by batch size: what ``dressed`` asks the ring for

    def constants(self, rows: int) -> dict[str, np.ndarray]:
        """The CPU stages' outputs that every batch of ``rows`` rows shares (``FeatureStage.constants``)."""
        constants = self._shared.get(rows)
        if constants is None:
            made: dict[str, np.ndarray] = {}
            for stage in self._cpu_stages:
                made.update(stage.constants(rows))
            # Threads that made them at the same time all take the first one kept: a thread that kept its own would
            # hand its batches arrays that are not ``constant_tensors``' (a tensor made anew for each, every batch).
            constants = self._shared.setdefault(rows, made)
        return constants

    def on_device(self, rows: int, device: torch.device) -> dict[str, torch.Tensor]:
        """The shared outputs of a batch of ``rows`` rows on ``device``, copied there once."""
        shared = self._device_shared.get(rows)
        if shared is None:
            shared = self._device_shared[rows] = {name: torch.from_numpy(array).to(device)
                                                  for name, array in self.constants(rows).items()}
        return shared

    def layout(self, rows: int) -> tuple[BufferLayout, dict[str, tuple]]:
        """The buffer layout of a batch of ``rows``, and the fixed shapes of every array the CPU stages make."""
        made = self._layouts.get(rows)
        if made is None:
            shapes: dict[str, tuple] = {}
            for stage in self._cpu_stages:
                shapes.update(stage.shapes(rows))
            constants = self.constants(rows)
            placed = {}
            for name in self._delivered:
                for key in (name, f"{name}.values", f"{name}.lengths", f"{name}.offsets"):
                    if key in shapes and key not in constants:
                        placed[key] = shapes[key]
            placed["index"] = ((rows,), np.dtype(np.int64))
            placed["valid"] = ((rows,), np.dtype(np.bool_))
            made = self._layouts[rows] = (BufferLayout(placed), shapes)
        return made

    def arrays(self, rows: int, buffer: np.ndarray | None, placed: dict[str, np.ndarray] | None = None
               ) -> dict[str, np.ndarray]:
        """The arrays the CPU stages write a batch into: views of ``buffer`` for what it carries (``placed``:
        those views, made already), this thread's scratch for the rest, and, where the sparse values are in the
        buffer and one input is all of them, that input as a view of them."""
        layout, shapes = self._layouts.get(rows) or self.layout(rows)
        scratch = self._scratch.__dict__
        # What is the same for every batch of this size on this thread (made once): the shared outputs and this
        # thread's scratch arrays for what the buffer does not carry.
        same = scratch.get(("arrays", rows, buffer is not None))
        if same is None:
            constants = self.constants(rows)
            carried = layout.places if buffer is not None else {}
            same = {"constant": bool(constants)}
            for name, (shape, dtype) in shapes.items():
                if name in constants:
                    same[name] = constants[name]
                elif name not in carried:
                    key = (name, shape, dtype)
                    if key not in scratch:
                        scratch[key] = np.empty(shape, dtype=dtype)
                    same[name] = scratch[key]
            scratch[("arrays", rows, buffer is not None)] = same
        arrays = same.copy()
        if buffer is None:
            arrays["index"] = arrays["valid"] = None
            return arrays
        if placed is None:
            placed = layout.views(buffer)  # (index and valid among them)
        arrays.update(placed)
        alias = self._alias
        if alias is not None and alias in arrays and "sparse.values" in placed:
            if alias not in placed:  # (a dressed buffer's views hold it already, made once: ``_dress``)
                arrays[alias] = placed["sparse.values"].reshape(arrays[alias].shape)
            arrays["sparse.aliased"] = alias  # what AssembleSparse then finds written already
        return arrays

    def dressed(self, rows: int) -> tuple[Dressed, dict[str, np.ndarray]]:
        """A CPU placement's buffer for a batch of ``rows`` from the ring, with its arrays' NumPy views and the
        tensors a batch in it is delivered as, both made once per buffer (a batch then costs no view and no
        tensor made anew); and a dict of the views (what ``arrays`` takes as ``placed``), which keeps the buffer
        taken while held (``BufferRing.dressed``)."""
        asked = self._asked.get(rows)
        if asked is None:  # (made once per size: no tuple and no function made per batch)
            layout, shapes = self.layout(rows)  # (a function of the layout: no cycle back to this object)
            asked = self._asked[rows] = ((layout.nbytes,), functools.partial(_dress, layout, shapes, self._alias))
        return self._ring.dressed(asked[0], torch.uint8, asked[1])

    def delivered(self, data: dict[str, Any], names: tuple[str, ...], dressed: Dressed, rows: int, valid: bool
                  ) -> dict[str, Any]:
        """The batch: the outputs ``names`` of ``data`` (a Jagged as a dict of its three arrays), ``index`` and,
        where ``valid``, ``valid`` (both written in the buffer), as torch tensors: the dressed buffer's own tensor
        for an array that is its view, the shared outputs' tensors (made once), and a tensor sharing the memory of
        anything else. (Straight from ``data``: no dict of the arrays built first.)"""
        own = dressed.views
        tensors = dressed.tensors
        shared = self._constant_tensors.get(rows) or self.constant_tensors(rows)
        out: dict[str, Any] = {}
        for name in names:
            value = data[name]
            if type(value) is np.ndarray and own.get(name) is value:  # (the usual case: written in the buffer)
                out[name] = tensors[name]
            elif isinstance(value, ops.Jagged):
                parts = self._parts.get(name) or self._parts.setdefault(
                    name, tuple((key, f"{name}.{key}") for key in ("values", "lengths", "offsets")))
                (_, values), (_, lengths), (_, offsets) = parts
                with_lengths, with_offsets = shared.get(lengths), shared.get(offsets)
                if own.get(values) is value.values and with_lengths is not None and with_lengths[0] is value.lengths \
                        and with_offsets is not None and with_offsets[0] is value.offsets:
                    # (the usual case: values written in the buffer, one per key and row: what _tensor_of would give)
                    out[name] = {"values": tensors[values], "lengths": with_lengths[1], "offsets": with_offsets[1]}
                else:
                    out[name] = {key: _tensor_of(full, getattr(value, key), own, tensors, shared)
                                 for key, full in parts}
            else:
                out[name] = _tensor_of(name, value, own, tensors, shared)
        out["index"] = tensors["index"]
        if valid:
            out["valid"] = tensors["valid"]
        return out

    def constant_tensors(self, rows: int) -> dict[str, tuple[np.ndarray, torch.Tensor]]:
        """The shared outputs of a batch of ``rows`` rows as (array, tensor sharing its memory), made once."""
        shared = self._constant_tensors.get(rows)
        if shared is None:  # (the first kept, as ``constants``)
            shared = self._constant_tensors.setdefault(rows, {name: (array, torch.from_numpy(array))
                                                              for name, array in self.constants(rows).items()})
        return shared

    def buffer(self, nbytes: int) -> tuple[Any, np.ndarray]:
        """A batch's buffer: (torch tensor, NumPy view): from the ring on the CPU, pinned for a GPU."""
        if self._ring is not None:
            tensor = self._ring.empty((nbytes,), torch.uint8)
        else:
            tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return tensor, tensor.numpy()

    def pack(self, moving: dict) -> tuple[torch.Tensor, tuple]:
        """``moving`` copied into a buffer of its own. The tensor handed on is the one the buffer was allocated
        as: a copy from pinned memory records its stream on that tensor, which keeps the memory from being
        handed out again while the copy runs."""
        allocated = []

        def allocate(nbytes: int) -> np.ndarray:
            tensor, view = self.buffer(nbytes)
            allocated.append(tensor)
            return view

        _, layout = transfer.pack(moving, allocate)
        return allocated[0], layout


def _dress(layout: BufferLayout, shapes: dict, alias: str | None, tensor: torch.Tensor) -> Dressed:
    """The buffer's views and tensors; with them, where the sparse values are in the buffer and one input is all
    of them (``alias``), that input as a view of them (what ``BatchArrays.arrays`` would make at every batch)."""
    array = tensor.numpy()
    views = layout.views(array)
    if alias is not None and alias in shapes and "sparse.values" in views and alias not in views:
        views[alias] = views["sparse.values"].reshape(shapes[alias][0])
    return Dressed(tensor, array, views, layout.torch_views(tensor))


def _tensor_of(name: str, value, own: dict, tensors: dict, shared: dict):
    """``value`` (the output ``name``) as a torch tensor: the buffer's tensor when ``value`` is its view of it,
    a shared output's tensor when it is that output's array, else one made to share its memory (or, for
    anything but an array, ``transfer.convert``'s)."""
    if type(value) is not np.ndarray:
        return transfer.convert(value, torch.from_numpy)
    if own.get(name) is value:
        return tensors[name]
    pair = shared.get(name)
    if pair is not None and pair[0] is value:
        return pair[1]
    return torch.from_numpy(value)
