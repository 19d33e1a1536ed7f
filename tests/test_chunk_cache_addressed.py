"""What a chunk cache hands the gather by address (``ChunkCache.addressed``): the cached chunks, their addresses and
layouts, made once after each change of what is cached (no list and no copy per batch), never stale past a change,
and holding the chunks it names; and ``touch`` keeping the order ``get`` would."""
import sys

import numpy as np
import pytest

from feedline import ops
from feedline.loader.sources.chunk_cache import ChunkCache, PackedChunk
from feedline.ops._native import kernels

needs_numba = pytest.mark.skipif(kernels("gather") is None, reason="numba kernels switched off or missing")
ROWS = 4


def records(c):
    """A chunk of ``ROWS`` records of one uint32 column (8-byte records, flags in the second word)."""
    data = np.zeros(ROWS * 16, np.uint8)
    data.view(np.uint32)[::4] = np.arange(ROWS) + 100 * c
    block = ops.ColumnBlock.records(data, [np.uint32], [0], 16, 8, [0], 8, ROWS)
    return PackedChunk(block, {}, np.zeros(ROWS, bool), {}, False)


@needs_numba
def test_the_same_objects_until_what_is_cached_changes():
    cache = ChunkCache(np.full(5, ROWS, np.int64), 3 * ROWS, reads_into=True)
    assert cache.addressed() is None
    for c in (0, 1):
        cache.get(c, records)
    first = cache.addressed()
    held, addresses, layouts = first
    assert [chunk.block.data[0] for chunk in held] == [0, 100]
    assert [c for c in range(5) if addresses[c, 0]] == [0, 1]
    cache.touch([1, 0])
    cache.get(1, records)  # (cached already: its order changes, not what is cached)
    assert cache.addressed() is first  # no new list, no new copy
    cache.get(2, records)
    second = cache.addressed()
    assert second is not first and [c for c in range(5) if second[1][c, 0]] == [0, 1, 2]
    assert first[1][2, 0] == 0  # (the one handed out before is never written)
    cache.get(3, records)  # drops chunk 0, the least lately used
    third = cache.addressed()
    assert sorted(cache) == [1, 2, 3] and [c for c in range(5) if third[1][c, 0]] == [1, 2, 3]
    assert len(third[0]) == 3


@needs_numba
def test_chunks_handed_out_are_held_past_their_eviction():
    """A gather that took the chunks just before one of them was dropped still reads its buffer: the buffer is not
    given out to be read into until the gather lets go."""
    cache = ChunkCache(np.full(3, ROWS, np.int64), ROWS, reads_into=True)
    cache.get(0, records)
    taken = cache.addressed()
    nbytes = taken[0][0].block.data.nbytes
    cache.get(1, records)  # drops chunk 0
    assert sorted(cache) == [1] and cache.spare(nbytes) is None  # ``taken`` holds it
    buffer_id = id(taken[0][0].block.data)
    del taken
    spare = cache.spare(nbytes)
    assert spare is not None and id(spare) == buffer_id and sys.getrefcount(spare) == 2


def test_touch_orders_the_cached_ones_as_get_does():
    cache = ChunkCache(np.full(6, ROWS, np.int64), 6 * ROWS, reads_into=False)
    for c in range(5):
        cache.get(c, records)
    cache.touch([3, 0, 9, 1])  # 9: not cached (dropped meanwhile), skipped
    assert list(cache) == [2, 4, 3, 0, 1]
    cache.touch([4, 2])
    assert list(cache) == [3, 0, 1, 4, 2]
