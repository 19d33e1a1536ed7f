"""feedline.ops: feature transforms on NumPy (CPU) or CuPy (GPU) arrays, bit-identical on both.

Each function returns the same array kind it was given. CuPy is only used when the caller passes
CuPy arrays, so importing this package needs neither CuPy nor a GPU.
"""

from .bucketize import bucketize
from .cross import cross
from .hashing import hash_buckets, murmur3_32
from .jagged import Jagged, keyed_jagged
from .multi_hot import multi_hot
from .normalize import normalize_dense
from .strings import Strings

__all__ = [
    "Jagged",
    "Strings",
    "bucketize",
    "cross",
    "hash_buckets",
    "keyed_jagged",
    "multi_hot",
    "murmur3_32",
    "normalize_dense",
]
