"""feedline.ops: feature transforms on NumPy (CPU) or CuPy (GPU) arrays, bit-identical on both.

Each function returns the same array kind it was given. CuPy is only used when the caller passes
CuPy arrays, so importing this package needs neither CuPy nor a GPU. On the CPU, the functions with a native
kernel (hashing, ``hash_columns``, ``normalize_columns``, ``gather_columns``, ``gather_rows``) run it through numba, loaded on
first use, and fall back to NumPy without numba: importing this package needs no numba either.
"""

from ._checks import MAX_NUM_BUCKETS, MAX_SEED
from .bucketize import bucketize
from .cross import cross
from .gather_columns import ColumnBlock, gather_columns, gather_picks, gather_raw, group_by_chunk
from .hash_columns import HashPlan, hash_columns, hash_plan
from .hashing import hash_buckets, murmur3_32
from .jagged import Jagged, keyed_jagged, one_per_row
from .multi_hot import multi_hot
from .normalize_values import normalize_dense
from .normalize_columns import DensePlan, dense_plan, normalize_columns
from .row_blocks import RowBlocks, RowLayout, gather_rows, locate_rows, pack_rows
from .sequence_rows import sequence_rows
from .strings import Strings

__all__ = [
    "MAX_NUM_BUCKETS",
    "MAX_SEED",
    "ColumnBlock",
    "DensePlan",
    "HashPlan",
    "Jagged",
    "RowBlocks",
    "RowLayout",
    "Strings",
    "bucketize",
    "cross",
    "dense_plan",
    "gather_columns",
    "gather_picks",
    "gather_raw",
    "gather_rows",
    "group_by_chunk",
    "hash_buckets",
    "hash_columns",
    "hash_plan",
    "keyed_jagged",
    "locate_rows",
    "multi_hot",
    "murmur3_32",
    "normalize_columns",
    "normalize_dense",
    "one_per_row",
    "pack_rows",
    "sequence_rows",
]
