"""MurmurHash3_x86_32 on the CPU for variable-length byte strings (Arrow offsets + data).

The hash chain of one string is sequential, so the loop runs over block positions instead of
strings: strings are ordered by block count (longest first) and step j updates the prefix of
strings that have a j-th block. Cost: total blocks plus one NumPy call batch per block position.
"""

from __future__ import annotations

import numpy as np

from ._murmur3_words import U32, fmix_inplace, mix_h_inplace, mix_k_inplace, reduce_into


def _gather_le_words(data: np.ndarray, positions: np.ndarray, nbytes: np.ndarray | int) -> np.ndarray:
    """uint32 little-endian word of the ``nbytes`` (<= 4) bytes starting at each position."""
    word = np.zeros(positions.shape[0], dtype=U32)
    for i in range(4):
        take = positions + i
        if isinstance(nbytes, int):
            if i >= nbytes:
                break
            byte = data[take].astype(U32)
        else:
            present = nbytes > i
            byte = np.zeros(positions.shape[0], dtype=U32)
            byte[present] = data[take[present]]
        np.bitwise_or(word, np.left_shift(byte, U32(8 * i)), out=word)
    return word


def hash_strings_cpu(
    offsets: np.ndarray, data: np.ndarray, seed: int, num_buckets: int | None, out: np.ndarray
) -> np.ndarray:
    """``offsets``: validated int64 (n + 1); ``data``: uint8. Writes hash or bucket per string."""
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    n = lengths.shape[0]
    h = np.full(n, seed, dtype=U32)
    tmp = np.empty(n, dtype=U32)

    nblocks = lengths // 4
    order = np.argsort(-nblocks, kind="stable")
    sorted_blocks = nblocks[order]
    block_base = np.concatenate(([0], np.cumsum(sorted_blocks)))
    total_blocks = int(block_base[-1])
    if total_blocks:
        row_of_block = np.repeat(np.arange(n), sorted_blocks)
        position = np.repeat(starts[order], sorted_blocks) + 4 * (
            np.arange(total_blocks) - block_base[:-1][row_of_block]
        )
        k_all = _gather_le_words(data, position, 4)
        mix_k_inplace(k_all, np.empty_like(k_all))
        # active[j]: how many strings (a prefix in sorted order) have a block j.
        active = np.searchsorted(-sorted_blocks, -np.arange(int(sorted_blocks[0])), side="left")
        h_sorted = h[order]
        for j, count in enumerate(active.tolist()):
            hs = h_sorted[:count]
            np.bitwise_xor(hs, k_all[block_base[:count] + j], out=hs)
            mix_h_inplace(hs, tmp[:count])
        h[order] = h_sorted

    tail_len = lengths % 4
    has_tail = tail_len > 0
    if has_tail.any():
        rows = np.flatnonzero(has_tail)
        k = _gather_le_words(data, starts[rows] + 4 * nblocks[rows], tail_len[rows])
        mix_k_inplace(k, np.empty_like(k))
        h[rows] ^= k

    np.bitwise_xor(h, lengths.astype(U32), out=h)
    fmix_inplace(h, tmp)
    reduce_into(h, num_buckets, out, tmp)
    return out
