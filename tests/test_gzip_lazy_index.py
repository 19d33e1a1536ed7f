"""A gzip table opened with no remembered index is indexed on a thread while its first batches are made: the
batches are those of the complete index (epochs 0 and 1, shuffled or not, every last_batch policy), every row
comes once per epoch, len() becomes exact, and errors met during the scan still name the file and line.

The scan is held (``held_scan``) after it has indexed a few shuffle buffer-fulls, so that the first batches
are surely made before the index is complete, whatever the machine's speed."""
import gzip
import os
import threading

import numpy as np
import pytest
import torch

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import DataError, Loader
from feedline.loader.sampler import BatchPlan, LastBatch
from feedline.loader.sources import growing_index, gzip_stream, line_index, tsv
from feedline.loader.stream_order import StreamOrder
from feedline.pipelines.criteo import criteo

from save_restore import flatten

pytestmark = pytest.mark.usefixtures("fresh_index_store")

ROWS = 9_001
BUFFER = 1_000   # shuffle buffer rows: nine windows
HOLD = 3_500     # rows the scan indexes before it is held


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of about 8 KiB (some 40 rows), so that the index grows in many steps."""
    monkeypatch.setattr(line_index, "CHUNK_BYTES", 8192)


def write_gz(path, rows=ROWS, seed=4, edit=None):
    plain = str(path) + ".plain"
    make_criteo(plain, rows, seed=seed)
    with open(plain, "rb") as f:
        data = f.read()
    os.unlink(plain)
    if edit is not None:
        data = edit(data)
    with gzip.open(path, "wb") as g:
        g.write(data)
    return str(path)


@pytest.fixture
def gz(tmp_path):
    return write_gz(tmp_path / "day.tsv.gz")


class held_scan:
    """While in the block, a lazily built index stops growing once it holds ``rows`` rows, until ``release``."""

    def __init__(self, monkeypatch, rows=HOLD):
        self.gate = threading.Event()
        self.holds = 0
        original = growing_index.GrowingIndex._publish

        def publish(index, scan, consumed, complete):
            original(index, scan, consumed, complete)
            if index.rows >= rows and not self.gate.is_set():
                self.holds += 1
                self.gate.wait(60)

        monkeypatch.setattr(growing_index.GrowingIndex, "_publish", publish)

    def release(self):
        self.gate.set()


def batches(loader, epochs=2, during=None):
    """Every batch of ``epochs`` epochs, flattened; ``during(loader, k)`` runs after the k-th batch."""
    out = []
    for _ in range(epochs):
        for batch in loader:
            out.append(flatten(batch))
            if during is not None:
                during(loader, len(out))
    return out


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], torch.Tensor):
                assert torch.equal(x[k], y[k]), k
            else:
                assert x[k] == y[k], k


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("policy", ["partial", "pad", "drop"])
def test_lazy_batches_are_the_complete_index_batches(gz, monkeypatch, shuffle, policy):
    hold = held_scan(monkeypatch)
    make = lambda: Loader(criteo(gz), batch_size=300, placement="cpu", shuffle=shuffle, seed=5,
                          last_batch=policy, shuffle_buffer=BUFFER, num_threads=2)
    lazy = make()
    assert lazy.source.pending
    seen_pending = []

    def during(loader, k):
        seen_pending.append(loader.source.pending)
        if k == 6:  # three windows' worth of batches made while the index was held
            hold.release()

    got = batches(lazy, during=during)
    assert seen_pending[:6] == [True] * 6 and hold.holds == 1
    assert not lazy.source.pending and lazy.source.num_rows == ROWS
    assert len(lazy) == len(got) // 2

    again = make()  # the index the scan kept: read at once, complete from the start
    assert again.source.growing is None and not again.source.pending
    expected = batches(again)
    same(got, expected)
    assert len(again) == len(lazy)
    # every row once per epoch (drop: all but the last partial batch's), nothing else valid
    per_epoch = len(got) // 2
    for e in range(2):
        rows = torch.cat([b["index"][b["valid"]] if "valid" in b else b["index"]
                          for b in got[e * per_epoch:(e + 1) * per_epoch]]).numpy()
        kept = ROWS // 300 * 300 if policy == "drop" else ROWS
        assert rows.size == kept and np.unique(rows).size == kept
        if policy != "drop":
            assert np.array_equal(np.sort(rows), np.arange(ROWS))


def test_len_is_an_estimate_until_the_index_is_complete(gz, monkeypatch):
    hold = held_scan(monkeypatch)
    loader = Loader(criteo(gz), batch_size=300, placement="cpu", shuffle_buffer=BUFFER)
    exact = -(-ROWS // 300)
    estimate = len(loader)
    assert loader.source.pending and isinstance(estimate, int) and estimate > HOLD // 300
    assert loader.source.num_rows < ROWS  # rows indexed so far
    hold.release()
    delivered = sum(1 for _ in loader)
    assert len(loader) == delivered == exact and len(loader.dataset) == ROWS


def test_a_truncated_gzip_met_by_the_scan_names_the_file(tmp_path, monkeypatch):
    path = write_gz(tmp_path / "cut.tsv.gz")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:int(len(data) * 0.8)])
    hold = held_scan(monkeypatch)
    loader = Loader(criteo(path), batch_size=300, placement="cpu", shuffle_buffer=BUFFER)
    assert loader.source.pending  # the first rows are whole: the file opens
    it = iter(loader)
    next(it)
    hold.release()
    with pytest.raises(DataError) as caught:
        for _ in it:
            pass
    assert path in str(caught.value) and "cut short" in str(caught.value)


def break_line(number):
    def edit(data):
        lines = data.split(b"\n")
        lines[number - 1] = lines[number - 1].replace(b"\t", b"\tzz", 1)
        return b"\n".join(lines)
    return edit


def test_a_bad_row_met_during_the_scan_names_its_file_and_line(tmp_path, monkeypatch):
    path = write_gz(tmp_path / "bad.tsv.gz", edit=break_line(1234))
    hold = held_scan(monkeypatch)
    loader = Loader(criteo(path), batch_size=300, placement="cpu", shuffle=False, shuffle_buffer=BUFFER)
    assert loader.source.pending
    with pytest.raises(DataError) as caught:
        for _ in loader:
            pass
    hold.release()
    assert f"{path}:1234" in str(caught.value)


def test_a_bad_row_skipped_during_the_scan_is_listed_and_left_invalid(tmp_path, monkeypatch):
    path = write_gz(tmp_path / "bad.tsv.gz", edit=break_line(1234))
    hold = held_scan(monkeypatch)
    make = lambda: Loader(criteo(path, on_error="skip"), batch_size=300, placement="cpu", seed=2,
                          shuffle_buffer=BUFFER)
    lazy = make()
    got = batches(lazy, epochs=1, during=lambda loader, k: hold.release() if k == 5 else None)
    assert [s.where for s in lazy.skipped] == [f"{path}:1234"]
    again = make()
    same(got, batches(again, epochs=1))
    rows = torch.cat([b["index"][b["valid"]] for b in got]).numpy()
    assert np.array_equal(np.sort(rows), np.delete(np.arange(ROWS), 1233))


def test_a_saved_state_waits_for_the_index_and_resumes_exactly(gz, monkeypatch):
    hold = held_scan(monkeypatch)
    make = lambda: Loader(criteo(gz), batch_size=300, placement="cpu", seed=9, shuffle_buffer=BUFFER)
    first = make()
    it = iter(first)
    taken = [flatten(next(it)) for _ in range(4)]
    assert first.source.pending
    threading.Timer(0.2, hold.release).start()
    state = first.state_dict()  # needs the row count: waits for the index
    assert not first.source.pending
    rest_first = [flatten(b) for b in it]
    second = make()
    second.load_state_dict(state)
    same(rest_first, [flatten(b) for b in second])
    assert len(taken) + len(rest_first) == -(-ROWS // 300)


@pytest.mark.parametrize("kwargs", [dict(rank=0, world_size=2), dict(rank=1, world_size=2)])
def test_several_ranks_index_the_whole_file_first(gz, kwargs):
    loader = Loader(criteo(gz), batch_size=300, placement="cpu", shuffle_buffer=BUFFER, **kwargs)
    assert loader.source.growing is None and loader.source.num_rows == ROWS


def test_a_remembered_or_plain_file_is_not_indexed_lazily(gz, tmp_path):
    first = Loader(criteo(gz), batch_size=300, placement="cpu", shuffle_buffer=BUFFER)
    first.source.wait_rows(ROWS + 1)
    assert Loader(criteo(gz), batch_size=300, placement="cpu", shuffle_buffer=BUFFER).source.growing is None
    plain = tmp_path / "plain.tsv"
    make_criteo(plain, 2000, seed=1)
    assert Loader(criteo(str(plain)), batch_size=300, placement="cpu", shuffle_buffer=BUFFER).source.growing is None


# ---- the order alone, against a table whose index grows in uneven steps -----------------------------------
class GrowingTable:
    """What StreamOrder asks of a table whose index is being built: rows revealed ``step`` past each wait."""

    def __init__(self, chunk_rows, step):
        self.final_rows = np.asarray(chunk_rows, dtype=np.int64)
        self.step = step
        self.known = min(step, int(self.final_rows.sum()))
        self.chunk_groups = np.zeros(self.final_rows.size, dtype=np.int64)

    @property
    def pending(self):
        return self.known < self.final_rows.sum()

    @property
    def num_rows(self):
        return self.known

    @property
    def chunk_rows(self):
        assert not self.pending, "the order read the chunks before the index was complete"
        return self.final_rows

    def wait_rows(self, rows):
        self.known = int(min(self.final_rows.sum(), max(self.known, rows) + self.step))
        return self.known, not self.pending

    def estimate_rows(self):
        return self.known


def plans_of(order, epoch, **kwargs):
    return [(p.indices.tolist(), p.valid.tolist(), p.epoch, p.start, p.last, p.batch)
            for p in order.epoch(epoch, **kwargs)]


@pytest.mark.parametrize("policy", list(LastBatch))
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("batch,buffer,step", [(7, 20, 1), (20, 20, 13), (30, 20, 50), (8, 64, 3), (5, 3, 2)])
def test_lazy_plans_equal_the_complete_order(policy, shuffle, batch, buffer, step):
    rng = np.random.default_rng(batch * buffer + step)
    chunk_rows = rng.integers(1, 25, size=17)
    complete = StreamOrder(chunk_rows, np.zeros(17), batch, shuffle=shuffle, seed=3, last_batch=policy,
                           buffer_rows=buffer)
    for epoch in (0, 1):
        for start in (None, batch * 2, batch * 2 + 1):
            kwargs = {} if start is None else dict(start_sample=start)
            table = GrowingTable(chunk_rows, step)
            lazy = StreamOrder(np.zeros(0), np.zeros(0), batch, shuffle=shuffle, seed=3, last_batch=policy,
                               buffer_rows=buffer, table=table)
            assert lazy._lazy is not None or not table.pending
            assert plans_of(lazy, epoch, **kwargs) == plans_of(complete, epoch, **kwargs)
            assert len(lazy) == len(complete)


def test_a_lazy_plan_is_a_plain_batch_plan():
    table = GrowingTable([10] * 10, 1)
    order = StreamOrder(np.zeros(0), np.zeros(0), 4, buffer_rows=8, table=table)
    plan = next(iter(order.epoch(0)))
    assert isinstance(plan, BatchPlan) and plan.indices.dtype == np.int64 and not plan.last


def test_auto_placement_over_a_table_still_indexed(gz, monkeypatch):
    hold = held_scan(monkeypatch)
    loader = Loader(criteo(gz), batch_size=300, shuffle_buffer=BUFFER, seed=1)  # placement="auto"
    assert loader.source.pending
    threading.Timer(0.5, hold.release).start()  # (auto's thread check needs the row count: it waits for it)
    rows = torch.cat([b["index"][b["valid"]] if "valid" in b else b["index"] for b in loader]).numpy()
    assert np.array_equal(np.sort(rows), np.arange(ROWS)) and len(loader) == -(-ROWS // 300)


def test_closing_the_loader_stops_the_scan(gz, monkeypatch):
    """A Loader closed while its gzip file is still being indexed does not go on decompressing the file: the scan's
    thread ends, keeps no index, and a wait for rows it never indexed raises instead of hanging."""
    hold = held_scan(monkeypatch)
    loader = Loader(criteo(gz), batch_size=500, placement="cpu", shuffle_buffer=BUFFER)
    next(iter(loader))
    scan = loader.source.growing
    assert scan is not None and not scan.complete
    loader.close()
    hold.release()
    scan.thread.join(30)
    assert not scan.thread.is_alive()
    assert not scan.complete
    with pytest.raises(DataError, match="closed before its index was complete"):
        scan.wait_rows(ROWS)


# ---- the scan hands its first chunks and marks to the reader (no second decompression on the way to batch 1) ----
class Counted(gzip_stream.GzipStream):
    """A reader's stream (``tsv``'s): counts the decompressed bytes it hands out."""

    given = 0

    def read(self, limit):
        out = super().read(limit)
        Counted.given += len(out)
        return out


def plain_bytes(path):
    with gzip.open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("members", [1, 3])
def test_the_scan_hands_exact_chunks_and_marks(gz, monkeypatch, members):
    """Every chunk the scan hands over is the stream's bytes [start, stop) with the byte before it; every mark
    resumes the stream at its position (blocks of an odd size, so that marks fall inside chunks and lines; a file
    of several gzip members, so that some fall between them)."""
    monkeypatch.setattr(growing_index, "BLOCK_BYTES", 5001)
    data = plain_bytes(gz)
    if members > 1:
        cuts = [0, len(data) // 3 + 17, 2 * len(data) // 3 + 5001 * 3, len(data)]
        with open(gz, "wb") as f:
            for a, b in zip(cuts, cuts[1:]):
                f.write(gzip.compress(data[a:b]))

    class Keeper:
        def __init__(self):
            self.chunks, self.marks = [], []

        def offer_mark(self, mark, before):
            self.marks.append((mark, before))
            return True

        def offer_chunk(self, start, stop, before, data):
            self.chunks.append((start, stop, before, data))
            return True

    keeper = Keeper()
    done = threading.Event()
    index = growing_index.GrowingIndex(gz, lambda arrays, complete: None, lambda arrays: done.set(), keeper)
    assert index.wait_complete() == ROWS and done.wait(30)
    starts, stops = LineScan_of(data)[:2]
    assert [(c[0], c[1]) for c in keeper.chunks] == list(zip(starts.tolist(), stops.tolist()))
    for start, stop, before, chunk in keeper.chunks:
        assert chunk == data[start:stop] and before == data[max(start - 1, 0):start]
    positions = [mark.position for mark, _ in keeper.marks]  # one before each block read but the first
    assert positions == sorted(set(positions)) and positions[0] > 0 and len(positions) >= len(data) // 5001 - 1
    for mark, before in keeper.marks:
        with gzip_stream.GzipStream.resume(gz, mark) as stream:
            got = b""
            while len(got) < 7000 and (block := stream.read(7000 - len(got))):
                got += block
        assert got == data[mark.position:mark.position + 7000] and before == data[mark.position - 1:mark.position]


def LineScan_of(data):
    scan = line_index.LineScan()
    scan.feed(data)
    return scan.finish().arrays()


@pytest.mark.parametrize("stash", [None, 60_000])
def test_the_first_reads_take_what_the_scan_decompressed(gz, monkeypatch, stash):
    """A lazily indexed file's readers take the chunks the scan decompressed (with a small stash: the first ones,
    then from the scan's marks, then as before) instead of decompressing the file again: up to the first batch
    they decompress nothing (with the default stash; a remembered index's readers decompress the first window),
    and the epoch's batches equal the remembered index's."""
    monkeypatch.setattr(tsv, "GzipStream", Counted)
    monkeypatch.setattr(growing_index, "BLOCK_BYTES", 20_011)  # marks every ~20 KB, inside chunks
    if stash is not None:
        monkeypatch.setattr(tsv, "STASH_BYTES", stash)
    make = lambda: Loader(criteo(gz), batch_size=300, placement="cpu", seed=3, shuffle_buffer=BUFFER,
                          num_threads=2, cache="off")  # (the table cache would serve the second one)
    Counted.given = 0
    lazy = make()
    assert lazy.source.growing is not None
    it = iter(lazy)
    got = [flatten(next(it))]
    first_read = Counted.given
    got += [flatten(b) for b in it]
    again = make()
    assert again.source.growing is None
    same(got, batches(again, epochs=1))
    probe = make()
    Counted.given = 0
    next(iter(probe))
    assert Counted.given >= BUFFER * 150  # (the first window, some 200 bytes a row)
    probe.close()
    if stash is None:
        assert first_read == 0


def test_a_cache_decision_taken_while_the_index_grows_stays(gz, monkeypatch):
    """The table cache decides on its first chunks, while the file is still being indexed; the file added again as
    its index grows and completes keeps that decision (it showed 'not decided yet' again, while in use)."""
    hold = held_scan(monkeypatch)
    loader = Loader(criteo(gz), batch_size=300, placement="cpu", shuffle_buffer=BUFFER, cache="on")
    it = iter(loader)
    for _ in range(6):
        next(it)
    decided = loader.source.reader.cache_decision
    assert loader.source.pending and decided.measured and decided.use
    hold.release()
    loader.source.growing.wait_complete()
    for _ in it:
        pass
    assert not loader.source.pending and loader.source.reader.cache_decision == decided
    loader.close()



def test_an_order_over_a_table_still_indexed_does_not_import_numpy_ma():
    """Whether a pending table's chunks form one read group is seen without np.unique (NumPy 2's imports
    numpy.ma: ~6-9 ms holding the GIL before a gzip file's first batch)."""
    import subprocess
    import sys

    code = """
import sys
import numpy as np
from feedline.loader.stream_order import StreamOrder

class Pending:
    pending = True
    num_rows = 100
    def wait_rows(self, rows):
        return self.num_rows, True

order = StreamOrder(np.full(4, 25, dtype=np.int64), np.zeros(4, dtype=np.int64), 10, seed=1, table=Pending())
assert order._lazy is not None
print("numpy.ma" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
