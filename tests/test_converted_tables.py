"""Converted tables (version 2: row records chunk by chunk, read with one pread into the cache) and the gather that
writes a batch straight from cached chunks: the file is what its docstring says (decoded here independently),
rows read back as the text had them, version 1 folders still read, wrong folders are refused by name, and
``gather`` gives exactly what ``read`` and the plain NumPy parse give, bad rows and list columns included."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import DataError
from feedline.loader.sources import columnar, open_source
from feedline.loader.sources.text_to_columnar import convert
from feedline.ops import _native
from feedline.pipelines.criteo import criteo
from feedline.pipelines.features import MISSING_ID
from feedline.pipelines.tabular import (Categorical, Column, ColumnKind, Cross, Dense, MultiHot, Schema,
                                        TabularFiles, tabular)

ROWS = 40_000  # three chunks, the last one short


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("converted")
    make_criteo(root / "day.tsv", ROWS, seed=7)
    text = criteo(root / "day.tsv")
    convert(text.source, root / "conv")
    return root, text, criteo(root / "conv")


def records_by_hand(folder) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The rows of a version 2 folder decoded from its description alone: (names, values int64, missing)."""
    meta = json.loads((folder / columnar.META).read_text())
    names = [c["name"] for c in meta["columns"]]
    dtypes = [np.dtype(c["dtype"]).newbyteorder("<") for c in meta["columns"]]
    order = sorted(range(len(names)), key=lambda j: -dtypes[j].itemsize)
    offsets, at = {}, 0
    for j in order:
        offsets[j] = at
        at += dtypes[j].itemsize
    record = -(-at // 8) * 8
    flag_bytes = -(-len(names) // 8)
    raw = (folder / columnar.DATA).read_bytes()
    values, missing, pos = [], [], 0
    for start in range(0, meta["rows"], meta["chunk_rows"]):
        n = min(meta["chunk_rows"], meta["rows"] - start)
        recs = np.frombuffer(raw, np.uint8, n * record, pos).reshape(n, record)
        flags_at = pos + -(-n * record // 8) * 8
        flags = np.frombuffer(raw, np.uint8, n * flag_bytes, flags_at).reshape(n, flag_bytes)
        values.append(np.stack([recs[:, offsets[j]:offsets[j] + dtypes[j].itemsize].copy().view(dtypes[j])[:, 0]
                                .astype(np.int64) for j in range(len(names))], axis=1))
        missing.append(np.unpackbits(flags, axis=1, count=len(names), bitorder="little").astype(bool))
        pos = flags_at + -(-n * flag_bytes // 8) * 8
    assert pos == len(raw)
    return names, np.concatenate(values), np.concatenate(missing)


def test_the_file_holds_the_text_rows_as_documented(tables):
    root, text, _ = tables
    names, values, missing = records_by_hand(root / "conv")
    rows = open_source(text.source).read(np.arange(ROWS))
    for j, name in enumerate(names):
        column = rows.columns[name]
        assert np.array_equal(missing[:, j], column.missing), name
        assert np.array_equal(values[~missing[:, j], j], column.values[~column.missing]), name
        assert (values[missing[:, j], j] == 0).all()  # missing values are stored as 0


def test_a_converted_table_reads_every_row_as_the_text(tables):
    _, text, conv = tables
    rows = np.random.default_rng(0).permutation(ROWS)[:9000]
    a, b = open_source(text.source).read(rows), open_source(conv.source).read(rows)
    for name in a.columns:
        assert np.array_equal(a.columns[name].missing, b.columns[name].missing), name
        keep = ~a.columns[name].missing
        assert np.array_equal(a.columns[name].values[keep], b.columns[name].values[keep]), name


def test_version_1_folders_still_read(tables, tmp_path):
    """A folder as the previous feedline wrote it (packed records in rows.bin, flags in missing.bin)."""
    root, text, _ = tables
    source = open_source(text.source)
    rows = source.read(np.arange(ROWS))
    names = [c.name for c in text.source.columns]
    dtypes = [columnar.narrowest(int(rows.columns[n].values.min(initial=0)), int(rows.columns[n].values.max(initial=0)))
              for n in names]
    records = np.zeros(ROWS, dtype=columnar.record_dtype(names, dtypes))
    for name in names:
        records[name] = np.where(rows.columns[name].missing, 0, rows.columns[name].values)
    flags = np.stack([rows.columns[n].missing for n in names], axis=1)
    folder = tmp_path / "v1"
    folder.mkdir()
    (folder / "rows.bin").write_bytes(records.tobytes())
    (folder / "missing.bin").write_bytes(np.packbits(flags, axis=1, bitorder="little").tobytes())
    (folder / columnar.META).write_text(json.dumps({"format": "feedline-columns", "version": 1, "rows": ROWS,
                                                    "columns": [{"name": n, "dtype": d.name} for n, d in
                                                                zip(names, dtypes)]}))
    old = open_source(criteo(folder).source)
    pick = np.random.default_rng(1).permutation(ROWS)[:5000]
    got, want = old.read(pick), source.read(pick)
    for name in names:
        assert np.array_equal(got.columns[name].missing, want.columns[name].missing)
        keep = ~want.columns[name].missing
        assert np.array_equal(got.columns[name].values[keep], want.columns[name].values[keep])


def test_folders_of_other_versions_or_broken_files_are_refused_by_name(tables, tmp_path):
    root, _, _ = tables
    folder = tmp_path / "future"
    folder.mkdir()
    meta = json.loads((root / "conv" / columnar.META).read_text())
    (folder / columnar.META).write_text(json.dumps({**meta, "version": 3}))
    with pytest.raises(DataError, match=f"^{folder}: .*version 3.*reads versions \\[1, 2\\]"):
        open_source(criteo(folder).source)
    (folder / columnar.META).write_text(json.dumps({**meta, "columns": [{"name": "label", "dtype": "float64"}]}))
    with pytest.raises(DataError, match=f"^{folder}: .*impossible values"):
        open_source(criteo(folder).source)
    (folder / columnar.META).write_text(json.dumps(meta))
    (folder / columnar.DATA).write_bytes((root / "conv" / columnar.DATA).read_bytes()[:-8])
    with pytest.raises(DataError, match=f"{columnar.DATA}: is missing or not"):
        open_source(criteo(folder).source)


def test_a_chunk_is_one_pread_into_its_own_buffer(tables, monkeypatch):
    _, _, conv = tables
    source = open_source(conv.source)
    calls = []
    real = columnar.os.preadv

    def counted(fd, buffers, offset):
        calls.append((len(buffers), offset))
        return real(fd, buffers, offset)

    monkeypatch.setattr(columnar.os, "preadv", counted)
    source.read(np.array([5, 20_000, 39_999]))
    assert len(calls) == 3 and all(n == 1 for n, _ in calls)
    layout = columnar.RecordLayout(source.reader._tables[source.paths[0]]["dtypes"])
    assert sorted(offset for _, offset in calls) == [0, layout.chunk_bytes(columnar.CHUNK_ROWS),
                                                     2 * layout.chunk_bytes(columnar.CHUNK_ROWS)]


def parse_of(spec, source, rows, *, gather: bool):
    """What the Parse stage makes of ``rows``: through ``gather``, or through ``read`` (a source without it)."""

    class ReadOnly:
        def read(self, r):
            return source.read(r)

    data, bad = spec.stages[0].read(source if gather else ReadOnly(), rows)
    return data, bad


@pytest.fixture(params=["native", "numpy"])
def kernels_or_numpy(request, monkeypatch):
    if request.param == "numpy":
        monkeypatch.setenv(_native.ENV, "0")
    _native.kernels.cache_clear()
    yield
    _native.kernels.cache_clear()


def same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(np.ascontiguousarray(a).view(np.uint8),
                                                                          np.ascontiguousarray(b).view(np.uint8))


@pytest.mark.parametrize("which", ["text", "converted"])
def test_gather_equals_read_then_parse(tables, which, kernels_or_numpy):
    _, text, conv = tables
    spec = text if which == "text" else conv
    source = open_source(spec.source, cache_rows=20_000)
    rows = np.random.default_rng(3).integers(0, ROWS, 8192)  # repeats and several chunks
    (a, bad_a), (b, bad_b) = parse_of(spec, source, rows, gather=True), parse_of(spec, source, rows, gather=False)
    assert not bad_a.any() and not bad_b.any()
    for name in ("label", "dense_raw", "categorical_raw"):
        assert same(a[name], b[name]), name
    assert (a["categorical_raw"] == MISSING_ID).any() and np.isnan(a["dense_raw"]).any()


def test_gather_marks_bad_rows_and_lists_each_once(tmp_path):
    path = tmp_path / "day.tsv"
    make_criteo(path, 3000, seed=2)
    lines = path.read_text().splitlines()
    for k in (7, 1500, 2999):
        lines[k] = "not\ta\tcriteo\tline"
    path.write_text("\n".join(lines) + "\n")
    spec = criteo(path, on_error="skip")
    source = open_source(spec.source)
    rows = np.array([2999, 3, 7, 1500, 7, 0])
    data, bad = parse_of(spec, source, rows, gather=True)
    assert bad.tolist() == [True, False, True, True, True, False]
    assert [s.where for s in source.skipped] == [f"{path}:3000", f"{path}:8", f"{path}:1501"]  # in the order met
    good = ~bad
    ref, _ = parse_of(spec, open_source(spec.source), rows, gather=False)
    for name in ("label", "dense_raw", "categorical_raw"):
        assert same(data[name][..., good], ref[name][..., good])
    with pytest.raises(DataError, match=f"^{path}:3000: expected 40"):
        parse_of(criteo(path), open_source(criteo(path).source), rows, gather=True)


def test_gather_reads_float_and_list_columns_of_parquet(tmp_path, kernels_or_numpy):
    rng = np.random.default_rng(5)
    n = 5000
    tags = [list(rng.integers(-50, 50, rng.integers(0, 5))) if rng.random() > 0.1 else None for _ in range(n)]
    table = pa.table({"y": rng.integers(0, 2, n), "age": [None if rng.random() < 0.2 else float(v)
                                                          for v in rng.normal(40, 15, n)],
                      "clicks": [None if rng.random() < 0.3 else int(v) for v in rng.integers(-5, 10**6, n)],
                      "shop": rng.integers(-(2**40), 2**40, n), "tags": pa.array(tags, type=pa.list_(pa.int64()))})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=1700)
    files = TabularFiles(tmp_path / "t.parquet", "parquet", (
        Column("y", ColumnKind.INT), Column("age", ColumnKind.FLOAT), Column("clicks", ColumnKind.INT),
        Column("shop", ColumnKind.INT), Column("tags", ColumnKind.INT_LIST)))
    spec = tabular(Schema("y", (Dense("age", clip_min=None), Categorical("shop", 97), Dense("clicks"),
                                MultiHot("tags", 11), Cross("shop", "clicks", 13))), files)
    source = open_source(spec.source)
    rows = rng.permutation(n)[:3000]
    (a, _), (b, _) = parse_of(spec, source, rows, gather=True), parse_of(spec, source, rows, gather=False)
    for name in ("label", "dense_raw", "categorical_raw"):
        assert same(a[name], b[name]), name
    for x, y in zip(a["lists_raw"], b["lists_raw"], strict=True):
        assert np.array_equal(x.offsets, y.offsets) and np.array_equal(x.values, y.values)
    ages = np.array([np.nan if v is None else v for v in table["age"].to_pylist()], dtype=np.float64)
    assert same(a["dense_raw"][0], ages[rows].astype(np.float32))  # floats read as float64, then float32


def test_gather_refuses_rows_outside_the_table(tables):
    _, _, conv = tables
    with pytest.raises(IndexError, match=rf"rows must lie in \[0, {ROWS}\)"):
        parse_of(conv, open_source(conv.source), np.array([0, ROWS]), gather=True)


def test_an_evicted_chunk_is_read_over_only_once_nothing_holds_it(tables):
    _, _, conv = tables
    source = open_source(conv.source)
    cache = source._cache
    cache.limit_rows = columnar.CHUNK_ROWS  # one chunk at a time
    held = cache.get(0, source._load)  # a gather still at work on chunk 0
    before, first = held.block.data.copy(), id(held.block.data)
    cache.get(1, source._load)  # chunk 0 is evicted; its buffer retired, but still held
    cache.get(0, source._load)  # read again, not into the held buffer
    assert id(cache.cached(0).block.data) != first and np.array_equal(held.block.data, before)
    del held
    cache.get(1, source._load)  # now the retired buffer is free: chunk 1 is read into it
    assert id(cache.cached(1).block.data) == first
    rows = source.read(np.arange(columnar.CHUNK_ROWS, 2 * columnar.CHUNK_ROWS))
    names, values, missing = records_by_hand(tables[0] / "conv")
    j = names.index("C3")
    keep = ~rows.columns["C3"].missing
    assert np.array_equal(rows.columns["C3"].values[keep], values[columnar.CHUNK_ROWS:2 * columnar.CHUNK_ROWS, j][keep])


def test_a_dropped_table_and_its_cached_chunks_are_freed_at_once(tables):
    """No reference cycle keeps an opened table (and the chunks its cache holds) alive until a garbage
    collection: dropping the last reference frees it."""
    import gc
    import weakref

    for declared in (tables[1], tables[2]):
        gc.disable()
        try:
            source = open_source(declared.source)
            source.read(np.arange(0, len(source), 997))
            freed = weakref.ref(source)
            del source
            assert freed() is None, declared.source.paths
        finally:
            gc.enable()
