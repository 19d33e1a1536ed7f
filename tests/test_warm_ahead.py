"""A streamed table's shuffle buffer-full is read ahead: every chunk a batch reads was asked for (warmed) before
the batch was made, from the second buffer-full on, each chunk once per buffer-full, and the batches are those
made without reading ahead."""
import numpy as np
import pyarrow.parquet as pq
import pytest

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import Loader
from feedline.pipelines.criteo import criteo

ROWS, GROUP, BUFFER, BATCH = 7000, 500, 2000, 250


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("warm") / "day.parquet"
    make_criteo(path, ROWS, seed=5, format="parquet")
    pq.write_table(pq.read_table(path), path, row_group_size=GROUP)  # 14 chunks of 500 rows
    return str(path)


def loader_of(path, **kwargs):
    return Loader(criteo(path), batch_size=BATCH, placement="cpu", seed=3, shuffle_buffer=BUFFER, num_threads=1,
                  **kwargs)


def test_every_chunk_a_batch_reads_was_warmed_before_the_batch_was_made(table):
    loader = loader_of(table)
    runner = loader.runner
    assert runner._warm_ahead == BUFFER // BATCH
    events = []
    warm, make = runner._warmed.warm, runner._host_part

    def warming(chunks):
        events.append(("warm", list(chunks)))
        warm(chunks)

    def making(plan):
        events.append(("make", plan))
        return make(plan)

    runner._warmed.warm, runner._host_part = warming, making
    batches = list(loader)  # one thread: tasks start in the order they were queued
    assert sorted(i for b in batches for i in b["index"].tolist()) == list(range(ROWS))
    first_row = loader.source.first_row
    warmed, made = set(), 0
    per_window: dict = {}
    for kind, what in events:
        if kind == "warm":
            warmed |= set(what)
            continue
        chunks = set(np.unique(np.searchsorted(first_row, what.indices, side="right") - 1).tolist())
        window = what.start // BUFFER
        if window > 0 and what.epoch == 0:
            assert chunks <= warmed, f"batch at {what.start}: chunks {sorted(chunks - warmed)} not asked for ahead"
            made += 1
    assert made == (ROWS - BUFFER) // BATCH
    # Shares of a buffer-full: each chunk asked for once by the plans of each buffer-full (edges: twice at most).
    asked = [c for kind, what in events if kind == "warm" for c in what]
    assert len(asked) <= len(set(asked)) + 2 * (-(-ROWS // BUFFER))


def test_the_batches_are_those_made_without_reading_ahead(table):
    got = []
    for ahead in (True, False):
        loader = loader_of(table)
        if not ahead:
            loader.runner._warm_ahead = 0
        got.append([{k: v for k, v in b.items() if k != "sparse"} | dict(b["sparse"]) for b in loader])
    for a, b in zip(*got, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if k == "keys":
                assert a[k] == b[k]
            else:
                assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k


def test_a_table_smaller_than_the_buffer_is_read_ahead_no_more_than_itself(table):
    """A buffer-full is at most the table: reading further ahead warmed the plans of epochs to come, thousands of
    them for a tiny table (a second a Loader)."""
    loader = Loader(criteo(table), batch_size=BATCH, placement="cpu", seed=3, shuffle_buffer=100_000,
                    num_threads=1)
    assert loader.runner._warm_ahead == ROWS // BATCH
    assert sorted(i for b in loader for i in b["index"].tolist()) == list(range(ROWS))


def test_the_plans_of_a_buffer_full_warm_shares_of_one_size(tmp_path):
    """Each plan of a buffer-full warms the chunks at its positions of the buffer-full's chunks (in number order),
    so the shares differ by one chunk at most and together are all of them; shares by chunk number (modulo the
    plans a buffer-full) gave one plan none and another several."""
    path = tmp_path / "day.parquet"
    make_criteo(path, 4000, seed=5, format="parquet")
    pq.write_table(pq.read_table(path), path, row_group_size=100)  # 40 chunks, 20 or 21 a buffer-full
    loader = Loader(criteo(str(path)), batch_size=500, placement="cpu", seed=3, shuffle_buffer=2000, num_threads=1)
    runner = loader.runner
    assert runner._warm_ahead == 4
    shares: dict = {}
    warm, ask = runner._warm, runner._warmed.warm
    current = []

    def warming(plan, part, parts):
        current[:] = [plan]
        warm(plan, part, parts)

    def asking(chunks):
        plan = current[0]
        if not plan.last:
            shares.setdefault((plan.epoch, plan.start // 2000), []).append(list(chunks))
        ask(chunks)

    runner._warm, runner._warmed.warm = warming, asking
    for epoch in range(2):
        assert sorted(i for b in loader for i in b["index"].tolist()) == list(range(4000))
    first_row = loader.source.first_row
    full = [(key, got) for key, got in shares.items() if len(got) == 4]
    assert len(full) >= 3
    for (epoch, window), got in full:
        sizes = [len(share) for share in got]
        assert max(sizes) - min(sizes) <= 1, (epoch, window, got)
        rows = loader.sampler.epoch(epoch)
        needed = set()
        for plan in rows:
            if plan.start // 2000 == window:
                needed |= set(np.unique(np.searchsorted(first_row, plan.indices, side="right") - 1).tolist())
        assert sorted(c for share in got for c in share) == sorted(needed)
