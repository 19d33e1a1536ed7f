"""``sequence_rows`` on the CPU (numba): the twin of the NumPy code in ``sequence_rows.py``, its reference."""
from __future__ import annotations

import numpy as np

from ._numba import kernel


@kernel
def sequence_rows(positions, shift, num_samples, seq_start, row_start, rows, valid):
    pieces = seq_start.shape[0]
    top = 1
    while top * 2 <= pieces:
        top *= 2
    for i in range(positions.shape[0]):
        v = positions[i] + shift
        inside = v < num_samples
        v = v if inside else v % num_samples
        k = 0  # the last k with seq_start[k] <= v, found without branches (positions come in random order)
        step = top
        while step > 0:
            j = k + step
            ok = (j < pieces) & (seq_start[min(j, pieces - 1)] <= v)
            k = j if ok else k
            step >>= 1
        rows[i] = row_start[k] + (v - seq_start[k])
        valid[i] = inside
