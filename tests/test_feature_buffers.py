"""A feature runner's per-size batch arrays (``BatchArrays``): the outputs every batch of a size shares are one set
of arrays for every thread, so each batch's are the tensors made of them once (none made per batch), and a batch
whose sparse values are in its buffer is delivered as the buffer's and the shared tensors."""
from __future__ import annotations

import numpy as np
import torch

from feedline import ops
from feedline.loader.runners.feature_buffers import BatchArrays
from feedline.pipelines.features import AssembleSparse, HashColumns


class Racing(AssembleSparse):
    """Another thread makes the shared outputs while this one is making them (deterministically: inside its
    own ``constants`` call, the first time)."""

    def constants(self, rows):
        made = super().constants(rows)
        if not self.__dict__.get("raced"):
            object.__setattr__(self, "raced", True)
            self.__dict__["other"] = self.__dict__["arrays"].constants(rows)
        return made


def test_threads_making_the_shared_outputs_together_keep_one_set():
    stage = Racing(consumes=("ids",), produces=("sparse",), keys=("a", "b"),
                   sources=(("ids", 0), ("ids", 1)))
    arrays = BatchArrays((stage,), ("sparse",), "ids", None)
    stage.__dict__["arrays"] = arrays
    mine = arrays.constants(8)
    other = stage.__dict__["other"]  # what the other thread got
    assert mine is other is arrays.constants(8)  # (the old code kept the last made: the other's arrays were stray)
    tensors = arrays.constant_tensors(8)
    for name, array in other.items():
        assert tensors[name][0] is array


def test_sparse_values_in_the_buffer_are_delivered_as_the_buffer_and_shared_tensors():
    from feedline.loader.runners.buffers import BufferRing

    ids = "categorical_ids"
    hashed = HashColumns(consumes=("categorical_raw",), produces=(ids,), categorical=((0, 10, 0), (1, 10, 0)),
                         crosses=())
    stage = AssembleSparse(consumes=(ids,), produces=("sparse",), keys=("a", "b"), sources=((ids, 0), (ids, 1)))
    arrays = BatchArrays((hashed, stage), ("sparse",), ids, BufferRing(4))
    rows = 8
    dressed, placed = arrays.dressed(rows)
    out = arrays.arrays(rows, dressed.array, placed)
    out[ids][:] = np.arange(2 * rows).reshape(2, rows)  # (what the hash stage writes: into the sparse values)
    data = {ids: out[ids], **stage.run({ids: out[ids]}, np, out)}
    batch = arrays.delivered(data, ("sparse",), dressed, rows, False)
    sparse = batch["sparse"]
    shared = arrays.constant_tensors(rows)
    assert sparse["values"] is dressed.tensors["sparse.values"]
    assert sparse["lengths"] is shared["sparse.lengths"][1] and sparse["offsets"] is shared["sparse.offsets"][1]
    assert torch.equal(sparse["values"], torch.arange(2 * rows))
    assert torch.equal(sparse["lengths"], torch.ones(2 * rows, dtype=torch.int32))
    assert torch.equal(sparse["offsets"], torch.arange(2 * rows + 1))
    # Anything else (here: lengths not the shared ones) goes the general way, with the same values.
    other = ops.Jagged(data["sparse"].values, data["sparse"].lengths.copy(), data["sparse"].offsets)
    again = arrays.delivered({"sparse": other}, ("sparse",), dressed, rows, True)["sparse"]
    assert again["values"] is sparse["values"] and again["lengths"] is not sparse["lengths"]
    assert torch.equal(again["lengths"], sparse["lengths"]) and "valid" in arrays.delivered(
        {"sparse": other}, ("sparse",), dressed, rows, True)
