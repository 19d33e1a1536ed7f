"""PreparedRows keeps what batches will read: chunks prepared ahead (``warm``) that no batch has read yet are
dropped after the chunks batches have read, whatever their stamps; values are the preparation's own."""
import numpy as np

from feedline import ops
from feedline.loader.sources.chunk_cache import PackedChunk
from feedline.loader.sources.prepared import PreparedRows

ROWS = 10  # rows per chunk


class FakeTable:
    """Chunks of ROWS rows; row ``r`` prepares to the label ``r`` (so a gather shows which rows it read)."""

    def __init__(self, chunks: int, cache_chunks: int):
        self.chunk_rows = np.full(chunks, ROWS, dtype=np.int64)
        self.first_row = np.arange(chunks, dtype=np.int64) * ROWS
        self.num_rows = chunks * ROWS
        self.cache_rows = cache_chunks * ROWS
        self.reads: list[int] = []

    def load_raw(self, c):
        self.reads.append(c)
        return PackedChunk(None, {}, np.zeros(ROWS, dtype=bool), {}, False), True

    def release_raw(self, chunk):
        pass


def prepare(table):
    def run(raw, block, clock):
        c = table.reads[-1]
        block[:, 0] = (np.arange(ROWS, dtype=np.float32) + c * ROWS).view(np.uint32)
        return {"prepare": 0.0}
    return run


def gather(prepared, rows):
    label = np.empty(len(rows), dtype=np.float32)
    prepared.gather(np.asarray(rows, dtype=np.int64), label=label)
    return label


def test_chunks_warmed_ahead_outlive_chunks_already_read():
    table = FakeTable(chunks=8, cache_chunks=4)
    prepared = PreparedRows(table, ops.RowLayout(1, 0, 0, 0), prepare(table), read_stage="parse")
    # A buffer-full of chunks 0 and 1 is read; chunks 2 and 3 (the next one) are warmed meanwhile, so that they
    # are stamped as recent as the latest batch. Then two more are warmed: the cache (4 chunks) must drop two.
    assert gather(prepared, [5, 15, 3]).tolist() == [5, 15, 3]
    prepared.warm([2, 3])
    assert gather(prepared, [0, 11]).tolist() == [0, 11]  # chunks 0 and 1 read again, after 2 and 3 were warmed
    prepared.warm([4, 5])
    # Chunks 0 and 1 (read) went, not 2 and 3 (warmed, unread), though 0 and 1 were read more lately.
    reads = len(table.reads)
    assert gather(prepared, [25, 39, 20]).tolist() == [25, 39, 20]
    assert len(table.reads) == reads, "a chunk warmed ahead was dropped before any batch read it"
    assert prepared.prepared_chunks == 6
    # Read chunks are dropped oldest first: 2 and 3 were just read, 4 and 5 not yet, so 0 comes back at 2's cost.
    assert gather(prepared, [7]).tolist() == [7]
    assert table.reads[-1] == 0
    assert gather(prepared, [41, 55]).tolist() == [41, 55]  # 4 and 5 still held
    assert len(table.reads) == 7


def test_a_batch_of_held_chunks_claims_none_of_them(monkeypatch):
    """Chunks a batch finds held (pinned by it) are not looked at one by one: only those missing are claimed."""
    table = FakeTable(chunks=8, cache_chunks=4)
    prepared = PreparedRows(table, ops.RowLayout(1, 0, 0, 0), prepare(table), read_stage="parse")
    assert gather(prepared, [5, 15, 3]).tolist() == [5, 15, 3]
    claimed = []
    real = prepared._loading.claim
    monkeypatch.setattr(prepared._loading, "claim", lambda c: claimed.append(c) or real(c))
    assert gather(prepared, [1, 12, 19]).tolist() == [1, 12, 19]
    assert claimed == []
    assert gather(prepared, [1, 22, 12]).tolist() == [1, 22, 12]
    assert claimed == [2] and table.reads == [0, 1, 2]
