"""``sequence_rows``: rows of a table laid out as a sequence of pieces, from positions in that sequence.

A shuffled epoch of a streamed table is a sequence of chunks laid end to end (``loader.stream_order``):
piece ``k`` starts at position ``seq_start[k]`` of the sequence and holds the table's rows ``row_start[k]``
onwards. For each ``p = positions[i] + shift``: a position past ``num_samples`` wraps around (padding:
``valid[i]`` False), and ``rows[i] = row_start[k] + p - seq_start[k]`` for the last ``k`` with
``seq_start[k] <= p``. A GIL-free numba kernel where numba is installed, else NumPy (its reference).
"""
from __future__ import annotations

import numpy as np

from ._native import kernels


def sequence_rows(positions: np.ndarray, shift: int, num_samples: int, seq_start: np.ndarray,
                  row_start: np.ndarray, rows: np.ndarray, valid: np.ndarray) -> None:
    """Fill ``rows`` (int64) and ``valid`` (bool), one per position (int64 arrays; ``seq_start`` increasing from
    0; a checked-input helper for the loader, which builds the arguments itself)."""
    native = kernels("sequence")
    if native is not None:
        native.sequence_rows(positions, np.int64(shift), np.int64(num_samples), seq_start, row_start, rows, valid)
        return
    v = positions + shift
    padding = v >= num_samples
    v = np.where(padding, v % num_samples, v)
    k = np.searchsorted(seq_start, v, side="right") - 1
    rows[...] = row_start[k] + (v - seq_start[k])
    valid[...] = ~padding


_WORD = (1 << 64) - 1
_COUNTER_WORD = (1 << 63) - 1  # (NumPy reads a list of counter words past this through float64: not exact)


def seeded_permutation(key: int, counter: tuple[int, int, int, int], size: int) -> np.ndarray:
    """``np.random.Generator(np.random.Philox(key=key, counter=counter)).permutation(size)`` (int64), the same
    bits, made by a GIL-free numba kernel where numba is installed (NumPy holds the GIL to make a Philox and
    a Generator: a seed sequence drawn from the system's entropy, a lock), else by NumPy itself."""
    native = kernels("sequence")
    words = list(counter)
    native_fits = 0 <= size <= 1 << 32 and 0 <= key < 1 << 128 and len(words) == 4 and \
        all(0 <= w <= _COUNTER_WORD for w in words)
    if native is None or not native_fits:  # (NumPy's own errors for what Philox does not take)
        return np.random.Generator(np.random.Philox(key=key, counter=words)).permutation(size)
    out = np.empty(size, dtype=np.int64)
    native.seeded_permutation(np.array([key & _WORD, key >> 64], dtype=np.uint64),
                              np.array(words, dtype=np.uint64), out)
    return out
