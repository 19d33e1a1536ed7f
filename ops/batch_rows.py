"""``batch_rows``: a batch's row numbers and validity written into its buffer in one pass, with the count of its
valid rows (so that a batch whose rows are all valid needs no look at its masks holding the GIL).

Definition: ``index_out[:] = indices``, ``valid_out[:] = valid & ~bad``, returns ``count_nonzero(valid_out)``. A
GIL-free numba kernel where numba is installed, else NumPy (its reference)."""
from __future__ import annotations

import numpy as np

from ._native import kernels


def batch_rows(indices: np.ndarray, valid: np.ndarray, bad: np.ndarray, index_out: np.ndarray,
               valid_out: np.ndarray) -> int:
    """Write ``indices`` (int64 [n]) into ``index_out`` and ``valid & ~bad`` (bool [n] each) into ``valid_out``;
    the number of valid rows. (A checked-input helper for the runners, which make the arguments themselves:
    1-D arrays of n, the outputs contiguous.)"""
    native = kernels("sequence")
    if native is not None:
        return native.batch_rows(np.ascontiguousarray(indices), np.ascontiguousarray(valid),
                                 np.ascontiguousarray(bad), index_out, valid_out)
    index_out[...] = indices
    np.logical_and(valid, ~bad, out=valid_out)
    return int(np.count_nonzero(valid_out))
