"""A streamed table's first epoch reads each chunk once where the cache can hold what the plans need: the chunks
warmed for the next shuffle buffer-full outlive those of the one being gathered, at the run's start (the first
tasks warm after their plan) as at every buffer-full's edge. (A guard: a26e807 already does so with a fixed
placement; the extra loads of a default Loader's first epoch come before it, from ``placement="auto"``'s profile,
which reads its own probe order: parsed twice with ``cache="off"``, read back from the table cache otherwise.)"""
import collections

import pyarrow.parquet as pq
import pytest

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import Loader
from feedline.loader.sources import chunked
from feedline.pipelines.criteo import criteo

ROWS, GROUP, BUFFER, BATCH = 6000, 100, 1000, 125  # 60 chunks, 10-11 a buffer-full, 8 plans a buffer-full


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("first") / "day.parquet"
    make_criteo(path, ROWS, seed=7, format="parquet")
    pq.write_table(pq.read_table(path), path, row_group_size=GROUP)
    return str(path)


@pytest.mark.parametrize("cache", ["off", "on"])
def test_the_first_epoch_reads_each_chunk_once(table, cache, monkeypatch):
    loads = collections.Counter()  # (epoch of the plan being made or warmed, chunk)
    epoch, mine = [None], []
    load = chunked.ChunkedTable._load

    def counted(self, c):
        if self in mine:  # (not another test's table, whose loader may still be closing)
            loads[epoch[0], c] += 1
        return load(self, c)

    monkeypatch.setattr(chunked.ChunkedTable, "_load", counted)
    loader = Loader(criteo(table), batch_size=BATCH, placement="cpu", seed=11, shuffle_buffer=BUFFER, num_threads=1,
                    cache=cache)
    mine.append(loader.source)
    runner = loader.runner
    assert runner._warm_ahead == BUFFER // BATCH
    warm, make = runner._warm, runner._host_part

    def warming(plan, part, parts):  # (one thread: one plan's work at a time)
        epoch[0] = plan.epoch
        warm(plan, part, parts)

    def making(plan):
        epoch[0] = plan.epoch
        return make(plan)

    runner._warm, runner._host_part = warming, making
    batches = iter(loader)
    rows = [i for _, b in zip(range(ROWS // BATCH), batches) for i in b["index"].tolist()]
    batches.close()
    loader.close()
    assert sorted(rows) == list(range(ROWS))
    first = {c: n for (e, c), n in loads.items() if e == 0}
    assert sorted(first) == list(range(ROWS // GROUP))
    assert not {c: n for c, n in first.items() if n > 1}, "chunks read more than once for the first epoch's plans"
