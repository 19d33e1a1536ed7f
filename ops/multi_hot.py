"""``multi_hot``: hash every element of a list column to buckets, keeping the first ``max_len``.

Input rows follow Arrow's list layout: row i holds ``values[offsets[i]:offsets[i + 1]]``. Each kept
element becomes ``hash_buckets(element, num_buckets, seed)``; the output is a ``Jagged`` whose
offsets start at 0.
"""

from __future__ import annotations

import numpy as np

from ._arrays import array_module
from ._checks import (
    check_num_buckets,
    check_optional_positive_int,
    check_seed,
    integer_keys,
    offsets_array,
)
from ._cuda import launch
from .hashing import hash_buckets
from .jagged import Jagged, offsets_from_lengths
from .strings import as_strings


def multi_hot(offsets, values, num_buckets: int, seed: int = 0, max_len: int | None = None) -> Jagged:
    """Bucket ids of each row's elements, each row truncated to its first ``max_len`` (None: all).

    ``values``: an int32/uint32/int64/uint64 array, or strings (``Strings``, pyarrow string array,
    list of ``str``). ``offsets``: int32/int64, length rows + 1, non-decreasing, within
    ``[0, len(values)]``.
    """
    num_buckets = check_num_buckets(num_buckets)
    seed = check_seed(seed)
    max_len = check_optional_positive_int("max_len", max_len)
    strings = as_strings(values)
    if strings is not None:
        xp = array_module(offsets=offsets, values=strings.offsets)
    else:
        xp = array_module(offsets=offsets, values=values)
        values = integer_keys("values", values, xp)
        if values.ndim != 1:
            raise ValueError(f"values must be 1-D, got shape {values.shape}")
    n_values = len(strings) if strings is not None else values.shape[0]
    offsets = offsets_array("offsets", offsets, n_values, "values", xp)

    lengths = offsets[1:] - offsets[:-1]
    if max_len is not None:
        lengths = xp.minimum(lengths, max_len)
    lengths = lengths.astype(np.int32)
    out_offsets = offsets_from_lengths(lengths, xp)
    total = int(out_offsets[-1])

    if strings is None and xp is not np:
        out = xp.empty(total, dtype=np.int64)
        rows = lengths.shape[0]
        launch("multi_hot.cu", f"fl_multi_hot_bucket_u{8 * values.dtype.itemsize}", total,
               (offsets, values, out_offsets, np.int64(rows), np.int64(total),
                np.uint32(seed), np.uint32(num_buckets), out))
        return Jagged(out, lengths, out_offsets)

    first = int(offsets[0])
    if max_len is None:
        positions = slice(first, first + total)
    else:
        positions = _kept_positions(offsets, out_offsets, total, xp)
    if strings is not None:  # hash the strings the rows cover, then pick the kept ones
        covered = hash_buckets(strings.slice(first, int(offsets[-1])), num_buckets, seed)
        kept = covered if max_len is None else covered[positions - first]
    else:
        kept = hash_buckets(values[positions], num_buckets, seed)
    return Jagged(kept, lengths, out_offsets)


def _kept_positions(offsets, out_offsets, total: int, xp):
    """Index into ``values`` of each output element: row r's j-th kept element is offsets[r] + j."""
    out_index = xp.arange(total, dtype=np.int64)
    row = xp.searchsorted(out_offsets, out_index, side="right") - 1
    return offsets[row] + (out_index - out_offsets[row])
