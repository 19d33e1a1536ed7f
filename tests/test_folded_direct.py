"""The folded stages of a plain tabular pipeline (parse, dense without buckets, hash) prepare a chunk by calling
their kernels straight (``folded._Direct``, issue 18: ~15 Python calls a chunk fewer, each holding the GIL with
the caches cold after the parse), and give the very block the stages run one by one give: every chunk of a
Criteo TSV, and of a table with crosses, in several runs a chunk; other stages keep the generic path."""
import time

import numpy as np
from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader.runners import folded as folded_module
from feedline.pipelines.criteo import criteo
from feedline.pipelines.tabular import Categorical, Column, ColumnKind, Cross, Dense, FileFormat, Schema, \
    TabularFiles, tabular
from runners import feature_runner


def _blocks(runner, direct: bool) -> list[tuple[bytes, list]]:
    folded, source = runner._folded, runner.source
    kept = folded._direct
    if not direct:
        folded._direct = None
    try:
        out = []
        for c in range(source.chunk_rows.size):
            raw, owned = source.load_raw(c)
            block = np.empty((int(source.chunk_rows[c]), folded.layout.width), dtype=np.uint32)
            seconds = folded._prepare(source, raw, block, time.perf_counter)
            if owned:
                source.release_raw(raw)
            out.append((block.tobytes(), sorted(seconds)))
        return out
    finally:
        folded._direct = kept


def _check_same(runner, monkeypatch):
    assert runner._folded is not None and runner._folded._direct is not None
    monkeypatch.setattr(folded_module, "RUN_ROWS", 700)  # several runs a chunk
    runner._folded._direct.steps = np.arange(10, dtype=np.int64)  # grown as runs ask
    generic = _blocks(runner, direct=False)
    direct = _blocks(runner, direct=True)
    assert generic and direct == generic
    assert runner._folded._direct.steps.size >= max(len(b) for b, _ in direct) // (4 * runner._folded.layout.width)


def test_criteo_chunks_prepared_straight_give_the_stages_blocks(tmp_path, monkeypatch):
    path = tmp_path / "c.tsv"
    make_criteo(path, 12000, seed=3)
    _check_same(feature_runner(criteo(str(path), table_sizes=1000)), monkeypatch)


def test_crosses_and_bad_rows_prepared_straight_give_the_stages_blocks(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    lines = [f"{rng.integers(2)}\t{'' if k % 7 == 0 else rng.integers(-5, 900)}\t{rng.integers(50):x}\t"
             f"{'' if k % 5 == 0 else format(rng.integers(1 << 40), 'x')}" for k in range(9000)]
    lines[17] = "1\tnot a number\t3\t4"  # a bad row: zeros, missing, in the block as the stages give it
    path = tmp_path / "x.tsv"
    path.write_text("\n".join(lines) + "\n")
    columns = (Column("y", ColumnKind.INT), Column("n", ColumnKind.INT), Column("a", ColumnKind.HEX),
               Column("b", ColumnKind.HEX))
    spec = tabular(Schema("y", (Dense("n", fill=1.5, clip_min=None), Categorical("a", 97, seed=2),
                                Categorical("b", 1 << 20, seed=9), Cross("a", "b", 1000, seed=4))),
                   TabularFiles((str(path),), FileFormat.TSV, columns, on_error="skip"))
    _check_same(feature_runner(spec), monkeypatch)


def test_dense_with_buckets_keeps_the_stages_path(tmp_path):
    path = tmp_path / "x.tsv"
    path.write_text("".join(f"{k % 2}\t{k}\t{k:x}\n" for k in range(3000)))
    columns = (Column("y", ColumnKind.INT), Column("n", ColumnKind.INT), Column("a", ColumnKind.HEX))
    spec = tabular(Schema("y", (Dense("n", boundaries=(1.0, 10.0)), Categorical("a", 97))),
                   TabularFiles((str(path),), FileFormat.TSV, columns))
    runner = feature_runner(spec)
    assert runner._folded is not None and runner._folded._direct is None


def test_without_numba_the_stages_run_as_they_are(tmp_path, monkeypatch):
    from feedline.ops._native import kernels

    path = tmp_path / "c.tsv"
    make_criteo(path, 3000, seed=3)
    monkeypatch.setenv("FEEDLINE_NUMBA", "0")
    kernels.cache_clear()
    try:
        runner = feature_runner(criteo(str(path), table_sizes=1000))
        assert runner._folded is not None and runner._folded._direct is None
        assert _blocks(runner, direct=False)
    finally:
        monkeypatch.delenv("FEEDLINE_NUMBA")
        kernels.cache_clear()
