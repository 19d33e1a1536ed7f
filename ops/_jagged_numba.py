"""``one_per_row`` on the CPU (numba): lengths and offsets of a jagged array with one value per row."""
from __future__ import annotations

from ._numba import kernel


@kernel
def one_per_row(lengths, offsets):
    for i in range(lengths.shape[0]):
        lengths[i] = 1
        offsets[i] = i
    offsets[lengths.shape[0]] = lengths.shape[0]
