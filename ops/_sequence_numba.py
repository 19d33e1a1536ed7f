"""``sequence_rows`` on the CPU (numba): the twin of the NumPy code in ``sequence_rows.py``, its reference.

A shuffled window of positions (a buffer-full: a permutation of a run of consecutive positions) is mapped by
laying out the run's rows in order, piece after piece, and reading them back in the positions' order; other
positions each search for their piece."""
from __future__ import annotations

import numpy as np

from ._numba import helper, kernel


@kernel
def sequence_rows(positions, shift, num_samples, seq_start, row_start, rows, valid):
    n = positions.shape[0]
    if n == 0:
        return
    low, high = low_high(positions)
    if high - low + 1 == n and dense_range(positions, low):
        ordered = np.empty(n, np.int64)
        ordered_valid = np.empty(n, np.bool_)
        fill_run(low + shift, num_samples, seq_start, row_start, ordered, ordered_valid)
        for i in range(n):
            rows[i] = ordered[positions[i] - low]
            valid[i] = ordered_valid[positions[i] - low]
        return
    search_each(positions, shift, num_samples, seq_start, row_start, rows, valid)


@helper
def low_high(positions):
    """The smallest and largest of ``positions`` (not empty), by a loop: the arrays' ``min()``/``max()`` come from
    numba's ``arraymath``, whose import (with ``scipy.linalg``, for numba's BLAS check) a cached kernel otherwise
    pays when a process first loads it."""
    low = positions[0]
    high = positions[0]
    for i in range(1, positions.shape[0]):
        v = positions[i]
        low = min(low, v)
        high = max(high, v)
    return low, high


@helper
def dense_range(positions, low):
    """Whether ``positions`` holds every value of ``[low, low + n)`` once."""
    n = positions.shape[0]
    seen = np.zeros(n, np.bool_)
    for i in range(n):
        k = positions[i] - low
        if seen[k]:
            return False
        seen[k] = True
    return True


@helper
def fill_run(first, num_samples, seq_start, row_start, rows, valid):
    """Rows of the consecutive positions ``first, first + 1, ...``, walking the pieces in order."""
    pieces = seq_start.shape[0]
    top = top_step(pieces)
    k = 0
    for i in range(rows.shape[0]):
        v = first + i
        inside = v < num_samples
        v = v if inside else v % num_samples
        if k + 1 < pieces and seq_start[k + 1] <= v or seq_start[k] > v:
            k = piece_of(seq_start, top, v)
        rows[i] = row_start[k] + (v - seq_start[k])
        valid[i] = inside


@helper
def search_each(positions, shift, num_samples, seq_start, row_start, rows, valid):
    top = top_step(seq_start.shape[0])
    for i in range(positions.shape[0]):
        v = positions[i] + shift
        inside = v < num_samples
        v = v if inside else v % num_samples
        k = piece_of(seq_start, top, v)
        rows[i] = row_start[k] + (v - seq_start[k])
        valid[i] = inside


@helper
def top_step(pieces):
    """The largest power of two <= ``pieces``: the first step of ``piece_of``."""
    top = 1
    while top * 2 <= pieces:
        top *= 2
    return top


@helper
def piece_of(seq_start, top, v):
    """The last ``k`` with ``seq_start[k] <= v``, found without branches (positions come in random order)."""
    pieces = seq_start.shape[0]
    k = 0
    step = top
    while step > 0:
        j = k + step
        ok = (j < pieces) & (seq_start[min(j, pieces - 1)] <= v)
        k = j if ok else k
        step >>= 1
    return k
