"""The chunk cache of a streamed table: a chunk is read once however many threads want it at the same time, the
cache holds at most its rows (and always the chunk just read), a failed read reaches every thread that waited for
it and is tried again later, and the buffers of dropped chunks are read into again only once nothing holds them."""
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from feedline.loader.sources.chunk_cache import ChunkCache, PackedChunk


def packed(nbytes=64):
    data = np.empty(nbytes, dtype=np.uint8)
    return PackedChunk(SimpleNamespace(data=data), {}, np.zeros(4, dtype=bool), {}, False)


class Reads:
    def __init__(self, pause=0.0, fail=()):
        self.count: dict[int, int] = {}
        self.pause, self.fail = pause, set(fail)
        self.lock = threading.Lock()

    def __call__(self, c):
        with self.lock:
            self.count[c] = self.count.get(c, 0) + 1
        time.sleep(self.pause)
        if c in self.fail:
            self.fail.discard(c)
            raise OSError(f"chunk {c} could not be read")
        return packed()


class Cache(ChunkCache):
    """The cache with one reader for every call, as a table gives its own."""

    def __init__(self, reads, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads = reads

    def get(self, c, load=None):
        return super().get(c, load or self.reads)


def test_threads_asking_together_share_one_read():
    reads = Reads(pause=0.05)
    cache = Cache(reads, np.full(4, 10), 100, reads_into=False)
    got, start = [], threading.Barrier(6)

    def ask():
        start.wait()
        got.append(cache.get(2))

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert reads.count == {2: 1}
    assert len(got) == 6 and all(g is got[0] for g in got)


def test_the_least_lately_used_chunks_go_past_the_limit():
    reads = Reads()
    cache = Cache(reads, np.array([4, 4, 4, 4]), 10, reads_into=False)
    cache.get(0), cache.get(1)
    cache.get(0)  # used again: 1 is now the oldest
    cache.get(2)  # 12 rows > 10: 1 goes
    assert cache.cached(1) is None and cache.cached(0) is not None and cache.cached(2) is not None
    assert list(cache) == [0, 2]
    cache.get(1)
    assert reads.count == {0: 1, 1: 2, 2: 1} and list(cache) == [2, 1]
    alone = Cache(Reads(), np.array([50]), 10, reads_into=False)
    assert alone.get(0) is alone.cached(0)  # a chunk larger than the limit is still kept, alone


def test_a_failed_read_reaches_every_waiter_and_is_tried_again():
    reads = Reads(pause=0.05, fail={1})
    cache = Cache(reads, np.full(3, 10), 100, reads_into=False)
    errors, start = [], threading.Barrier(3)

    def ask():
        start.wait()
        try:
            cache.get(1)
        except OSError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == ["chunk 1 could not be read"] * 3 and reads.count == {1: 1}
    assert cache.cached(1) is None
    assert cache.get(1) is cache.cached(1) and reads.count == {1: 2}


def test_dropped_buffers_are_read_into_again_once_free():
    cache = Cache(Reads(), np.array([4, 4, 4]), 4, reads_into=True)
    first = cache.get(0)
    cache.get(1)  # drops chunk 0, whose buffer `first` still holds
    assert cache.spare(64) is None
    buffer_id = id(first.block.data)
    del first
    spare = cache.spare(64)
    assert spare is not None and id(spare) == buffer_id and sys.getrefcount(spare) == 2
    assert cache.spare(64) is None  # handed out once
    assert cache.spare(32) is None  # and only for its size


@pytest.mark.parametrize("reads_into", [False, True])
def test_a_released_chunk_is_reused_only_for_buffers_read_into(reads_into):
    cache = Cache(Reads(), np.array([4]), 4, reads_into=reads_into)
    cache.release(packed(128))
    assert (cache.spare(128) is not None) is reads_into
