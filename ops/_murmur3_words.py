"""MurmurHash3_x86_32 on the CPU for keys made of a fixed number of little-endian uint32 words.

Vectorised NumPy, processed in cache-sized chunks with preallocated scratch buffers and in-place
ufuncs. Every constant is a NumPy uint32 so that no step promotes to a signed or float type.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

U32 = np.uint32
C1 = U32(0xCC9E2D51)
C2 = U32(0x1B873593)
H_MUL = U32(5)
H_ADD = U32(0xE6546B64)
F1 = U32(0x85EBCA6B)
F2 = U32(0xC2B2AE35)

CHUNK_ROWS = 32768


def rotl_inplace(x: np.ndarray, r: int, tmp: np.ndarray) -> None:
    np.right_shift(x, U32(32 - r), out=tmp)
    np.left_shift(x, U32(r), out=x)
    np.bitwise_or(x, tmp, out=x)


def mix_k_inplace(k: np.ndarray, tmp: np.ndarray) -> None:
    np.multiply(k, C1, out=k)
    rotl_inplace(k, 15, tmp)
    np.multiply(k, C2, out=k)


def mix_h_inplace(h: np.ndarray, tmp: np.ndarray) -> None:
    """h = rotl(h, 13) * 5 + 0xe6546b64, after the caller has xored the mixed block into h."""
    rotl_inplace(h, 13, tmp)
    np.multiply(h, H_MUL, out=h)
    np.add(h, H_ADD, out=h)


def fmix_inplace(h: np.ndarray, tmp: np.ndarray) -> None:
    for shift, mul in ((16, F1), (13, F2)):
        np.right_shift(h, U32(shift), out=tmp)
        np.bitwise_xor(h, tmp, out=h)
        np.multiply(h, mul, out=h)
    np.right_shift(h, U32(16), out=tmp)
    np.bitwise_xor(h, tmp, out=h)


def reduce_into(h: np.ndarray, num_buckets: int | None, out: np.ndarray, tmp: np.ndarray) -> None:
    """out = h (raw hash) or h % num_buckets; ``out`` may be uint32 or int64."""
    if num_buckets is None:
        np.copyto(out, h)
    elif num_buckets & (num_buckets - 1) == 0:
        np.bitwise_and(h, U32(num_buckets - 1), out=out)
    else:
        # floor_divide by a scalar uses libdivide; about 3x faster than np.remainder here.
        divisor = U32(num_buckets)
        np.floor_divide(h, divisor, out=tmp)
        np.multiply(tmp, divisor, out=tmp)
        np.subtract(h, tmp, out=out)


def hash_words(
    sources: Sequence[np.ndarray], seed: int, num_buckets: int | None, out: np.ndarray
) -> np.ndarray:
    """Hash each row of the word matrix formed by concatenating ``sources`` along axis 1.

    ``sources`` are 2-D uint32 arrays with equal row counts; row i of their concatenation holds the
    key's bytes in little-endian order. Writes the hash (or bucket) of row i into ``out[i]``.
    """
    n = sources[0].shape[0]
    width = sum(s.shape[1] for s in sources)
    rows = min(CHUNK_ROWS, n)
    direct = len(sources) == 1 and sources[0].flags.c_contiguous
    words = None if direct else np.empty((rows, width), dtype=U32)
    k_buf = np.empty(rows * width, dtype=U32)
    k_tmp = np.empty(rows * width, dtype=U32)
    h_buf = np.empty(rows, dtype=U32)
    h_tmp = np.empty(rows, dtype=U32)
    seed32 = U32(seed)
    length32 = U32(4 * width)
    for start in range(0, n, CHUNK_ROWS):
        m = min(CHUNK_ROWS, n - start)
        if direct:
            block = sources[0][start : start + m]
        else:
            block = words[:m]
            col = 0
            for s in sources:
                np.copyto(block[:, col : col + s.shape[1]], s[start : start + m])
                col += s.shape[1]
        k = k_buf[: m * width]
        kt = k_tmp[: m * width]
        np.multiply(block.reshape(-1), C1, out=k)
        rotl_inplace(k, 15, kt)
        np.multiply(k, C2, out=k)
        k = k.reshape(m, width)
        h, ht = h_buf[:m], h_tmp[:m]
        if seed:
            np.bitwise_xor(k[:, 0], seed32, out=h)
            mix_h_inplace(h, ht)
        else:  # h = rotl(k0, 13) straight from k, saving a copy
            np.right_shift(k[:, 0], U32(19), out=ht)
            np.left_shift(k[:, 0], U32(13), out=h)
            np.bitwise_or(h, ht, out=h)
            np.multiply(h, H_MUL, out=h)
            np.add(h, H_ADD, out=h)
        for j in range(1, width):
            np.bitwise_xor(h, k[:, j], out=h)
            mix_h_inplace(h, ht)
        np.bitwise_xor(h, length32, out=h)
        fmix_inplace(h, ht)
        reduce_into(h, num_buckets, out[start : start + m], ht)
    return out


def key_words(keys: np.ndarray) -> np.ndarray:
    """A C-contiguous native int32/uint32/int64/uint64 array viewed as (n, words) uint32, no copy."""
    flat = keys.reshape(-1)
    return flat.view(U32).reshape(flat.shape[0], keys.dtype.itemsize // 4)
