"""Text tables cached as they are parsed (issue 22, tables): the first epoch writes each parsed chunk in the
converted form and later epochs, Loaders and ranks read it back instead of parsing, with the same bits in every
batch (bad rows included); a changed file, a torn or partial cache, a folder that cannot be written and a cache
that would not pay are each met as the module says. Parsing is counted by wrapping ``TsvFormat.parse``."""
from __future__ import annotations

import errno
import gzip
import hashlib
import os
import shutil

import numpy as np
import pytest
import torch

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import DataError, Loader
from feedline.loader.cache_policy import CacheMode, CacheSettings
from feedline.loader.sources import cached_chunks, index_store, open_source, tsv
from feedline.loader.sources.table_rows import ListColumn
from feedline.loader.sources.columnar import narrowest
from feedline.ops.gather_columns import BIT_FLAGS, DTYPES
from feedline.pipelines.criteo import criteo
from feedline.pipelines.tabular import Categorical, Column, Dense, MultiHot, Schema, TabularFiles, tabular

ROWS = 40_000  # 9 chunks of text: more than a Loader with shuffle_buffer=1024 keeps parsed in memory
BAD_LINES = (5, 17_003, 33_333)  # 1-based lines made bad in every file


pytestmark = pytest.mark.usefixtures("fresh_index_store")


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    """A Criteo TSV and its gzip, with three bad lines each, made once and copied into each test's folder."""
    root = tmp_path_factory.mktemp("made")
    make_criteo(root / "day.tsv", ROWS, seed=3)
    lines = (root / "day.tsv").read_bytes().split(b"\n")
    for k in BAD_LINES:
        lines[k - 1] = b"1\tnot a number" + lines[k - 1][13:]
    text = b"\n".join(lines)
    (root / "day.tsv").write_bytes(text)
    (root / "day.tsv.gz").write_bytes(gzip.compress(text, 1))
    return {"day.tsv": root / "day.tsv", "day.tsv.gz": root / "day.tsv.gz"}


def copy(made: dict, name: str, folder) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    shutil.copyfile(made[name], target)
    return str(target)


class Counts:
    """Chunks parsed and chunks read back from the cache, counted by wrapping the two."""

    def __init__(self, monkeypatch):
        self.parsed = self.read = 0
        parse, read = tsv.TsvFormat.parse, cached_chunks.read

        def counted_parse(fmt, data, rows):
            self.parsed += 1
            return parse(fmt, data, rows)

        def counted_read(*args, **kwargs):
            stored = read(*args, **kwargs)
            self.read += stored is not None
            return stored

        monkeypatch.setattr(tsv.TsvFormat, "parse", counted_parse)
        monkeypatch.setattr(cached_chunks, "read", counted_read)

    def take(self) -> tuple[int, int]:
        got = (self.parsed, self.read)
        self.parsed = self.read = 0
        return got


def _update(h, value) -> None:
    if isinstance(value, dict):
        for k in sorted(value):
            h.update(k.encode())
            _update(h, value[k])
    elif isinstance(value, torch.Tensor):
        h.update(f"{value.dtype}{tuple(value.shape)}".encode())
        h.update(value.contiguous().numpy().tobytes())
    else:
        h.update(repr(value).encode())


def epoch_digest(loader) -> str:
    h = hashlib.sha256()
    for batch in loader:
        _update(h, batch)
    return h.hexdigest()


def loader_of(path, cache, *, on_error="skip", **kwargs) -> Loader:
    return Loader(criteo(path, on_error=on_error), batch_size=1024, shuffle_buffer=1024, seed=5, cache=cache,
                  placement="cpu", **kwargs)


def chunk_files(path) -> list[str]:
    folder = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.feedline-tablecache")
    return sorted(p for p in (os.path.join(d, n) for d, _, names in os.walk(folder) for n in names)
                  if p.endswith(".feedline-chunk"))


@pytest.mark.parametrize("name, mode", [("day.tsv", "on"), ("day.tsv.gz", "on"), ("day.tsv", "auto")])
def test_three_epochs_same_bits_with_and_without_the_cache(made, name, mode, tmp_path, monkeypatch):
    counts = Counts(monkeypatch)
    plain = loader_of(copy(made, name, tmp_path / "plain"), "off")
    expected = [epoch_digest(plain) for _ in range(3)]
    expected_skips = [(os.path.basename(s.where), s.reason) for s in plain.skipped]
    parsed_row_bytes = plain.source.cached_row_bytes
    plain.close()
    assert counts.take()[1] == 0 and not os.path.exists(tmp_path / "plain" / f".{name}.feedline-tablecache")
    assert len(expected_skips) == len(BAD_LINES)

    path = copy(made, name, tmp_path / "cached")
    loader = loader_of(path, mode)
    # gathered from narrow records as a converted table's (by the first chunk's), not first prepared
    assert 100 < loader.source.cached_row_bytes < parsed_row_bytes == 9 * 40
    first = epoch_digest(loader)
    parsed, read = counts.take()
    assert parsed >= 9 and len(chunk_files(path)) == 9  # every chunk parsed once and kept
    later = [epoch_digest(loader) for _ in range(2)]
    parsed, read = counts.take()
    assert parsed == 0 and read > 0  # later epochs read chunks, from the cache only
    assert [first, *later] == expected
    assert [(os.path.basename(s.where), s.reason) for s in loader.skipped] == expected_skips
    decision = loader.source.reader.cache_decision
    assert decision.use and decision.measured and decision.mode == mode
    assert decision.recompute_s > 0 and decision.read_s > 0 and decision.bytes_needed > 0
    assert loader.plan["cache"] == decision.as_dict()  # what feedline plan shows
    loader.close()


def test_a_second_loader_reads_the_cache_and_parses_nothing(made, tmp_path, monkeypatch):
    counts = Counts(monkeypatch)
    path = copy(made, "day.tsv", tmp_path)
    first = loader_of(path, "on")
    expected = [epoch_digest(first) for _ in range(2)]
    first.close()
    counts.take()
    second = loader_of(path, "auto")  # the figures kept in the chunk files decide for it
    assert [epoch_digest(second) for _ in range(2)] == expected
    parsed, read = counts.take()
    assert parsed == 0 and read >= 9
    decision = second.source.reader.cache_decision
    assert decision.use and decision.mode == "auto" and "cached:" in decision.reason
    assert sorted(s.where for s in second.skipped) == sorted(f"{path}:{k}" for k in BAD_LINES)
    second.close()


def test_second_loader_parse_count(made, tmp_path, monkeypatch):
    counts = Counts(monkeypatch)
    path = copy(made, "day.tsv.gz", tmp_path)
    first = loader_of(path, "on")
    expected = epoch_digest(first)
    first.close()
    counts.take()
    second = loader_of(path, "on")
    assert epoch_digest(second) == expected
    parsed, read = counts.take()
    assert parsed == 0 and read >= 9
    second.close()


def test_a_bad_row_raises_the_same_error_from_the_cache(made, tmp_path, monkeypatch):
    path = copy(made, "day.tsv", tmp_path)
    errors = []
    for _ in range(2):
        loader = loader_of(path, "on", on_error="raise", shuffle=False)
        with pytest.raises(DataError) as e:
            epoch_digest(loader)
        errors.append(str(e.value))
        loader.close()
    counts = Counts(monkeypatch)
    loader = loader_of(path, "on", on_error="raise", shuffle=False)
    with pytest.raises(DataError) as e:
        epoch_digest(loader)
    assert counts.take()[0] == 0  # the bad row came from the cache
    loader.close()
    assert errors[0] == errors[1] == str(e.value) and f"{path}:{BAD_LINES[0]}" in errors[0]


def test_a_rewritten_file_of_the_same_size_and_times_is_parsed_again(made, tmp_path, monkeypatch):
    path = copy(made, "day.tsv", tmp_path)
    loader = loader_of(path, "on")
    old = epoch_digest(loader)
    loader.close()
    old_folders = os.listdir(os.path.dirname(chunk_files(path)[0]) + "/..")
    st = os.stat(path)
    data = bytearray(open(path, "rb").read())
    at = data.index(b"\n", 4 << 20) + 1  # a label in the middle of the file, 0 <-> 1: same size
    data[at] = ord("1") if data[at] == ord("0") else ord("0")
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.path.getsize(path) == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns

    reference = loader_of(copy({"x.tsv": path}, "x.tsv", tmp_path / "fresh"), "off")
    expected = epoch_digest(reference)
    reference.close()
    counts = Counts(monkeypatch)
    loader = loader_of(path, "on")
    got = epoch_digest(loader)
    parsed, read = counts.take()
    loader.close()
    assert got == expected != old and parsed >= 9
    new_folders = os.listdir(os.path.dirname(chunk_files(path)[0]) + "/..")
    assert len(old_folders) == len(new_folders) == 1 and old_folders != new_folders  # the old key removed


def test_a_file_changed_after_opening_is_not_read_from_the_cache(made, tmp_path):
    path = copy(made, "day.tsv", tmp_path)
    table = open_source(criteo(path, on_error="skip").source, cache_rows=0,
                        cache=CacheSettings(mode=CacheMode.ON))
    # Every chunk kept, read one after another, so that chunk 0, read first, is no longer in memory.
    first = table.read(np.array([0])).columns["label"].values[0]
    for c in range(1, table.first_row.size):
        table.read(np.array([table.first_row[c]]))
    assert 0 not in list(table._cache)
    assert len(chunk_files(path)) == 9
    with open(path, "r+b") as f:  # the first line's label changes in place
        f.write(b"1" if f.read(1) == b"0" else b"0")
    assert table.read(np.array([0])).columns["label"].values[0] == 1 - first  # parsed again, not the kept chunk


def test_a_torn_or_partial_cache_falls_back_to_parsing(made, tmp_path, monkeypatch):
    path = copy(made, "day.tsv.gz", tmp_path)
    loader = loader_of(path, "on")
    expected = [epoch_digest(loader) for _ in range(2)]
    loader.close()
    files = chunk_files(path)
    with open(files[0], "r+b") as f:  # cut short
        f.truncate(os.path.getsize(files[0]) - 8)
    with open(files[1], "r+b") as f:  # another key
        f.seek(8)
        f.write(b"\xff" * cached_chunks.KEY_BYTES)
    with open(files[2], "ab") as f:  # longer than its header says
        f.write(b"\0" * 8)
    os.unlink(files[3])  # never written: a first epoch killed before it
    open(files[4] + ".123.abcd.tmp", "wb").write(b"half a chunk")  # a write killed halfway
    counts = Counts(monkeypatch)
    loader = loader_of(path, "on")
    assert epoch_digest(loader) == expected[0]
    parsed, read = counts.take()
    assert parsed == 4 and read >= 5  # the four damaged or missing chunks parsed (once: then kept), the others read
    assert epoch_digest(loader) == expected[1]
    loader.close()
    counts.take()
    again = loader_of(path, "on")  # the parsed chunks were written again, whole
    assert epoch_digest(again) == expected[0]
    assert counts.take()[0] == 0
    again.close()


@pytest.mark.parametrize("elsewhere", ["index_dir", "directory", "nowhere"])
def test_a_read_only_folder(made, tmp_path, monkeypatch, elsewhere):
    data = tmp_path / "ro"
    path = copy(made, "day.tsv", data)
    plain = loader_of(copy(made, "day.tsv", tmp_path / "plain"), "off")
    expected = epoch_digest(plain)
    plain.close()

    def read_only(folder):  # what a read-only mount answers (chmod does not stop root, who runs CI)
        def refuse(*args, **kwargs):
            if str(args[0]).startswith(str(data)):
                raise OSError(errno.EROFS, "Read-only file system")
            return real[folder](*args, **kwargs)
        return refuse

    real = {"makedirs": os.makedirs, "write_file": cached_chunks.write_file, "_write": index_store._write}
    monkeypatch.setattr(os, "makedirs", read_only("makedirs"))
    monkeypatch.setattr(cached_chunks, "write_file", read_only("write_file"))
    monkeypatch.setattr(index_store, "_write", read_only("_write"))
    cache = "on"
    if elsewhere == "index_dir":
        monkeypatch.setenv(index_store.INDEX_DIR_ENV, str(tmp_path / "indexes"))
    elif elsewhere == "directory":
        cache = CacheSettings(mode=CacheMode.ON, directory=str(tmp_path / "mine"))
    counts = Counts(monkeypatch)
    for k in range(2):
        loader = loader_of(path, cache)
        assert epoch_digest(loader) == expected
        parsed, read = counts.take()
        decision = loader.source.reader.cache_decision
        loader.close()
        if elsewhere == "nowhere":
            assert not decision.use and "no folder for the cache" in decision.reason and read == 0
        else:
            assert decision.use and (parsed == 0 if k else read >= 1)
    assert sorted(os.listdir(data)) == ["day.tsv"]  # nothing beside the data
    kept = {"index_dir": tmp_path / "indexes", "directory": tmp_path / "mine"}.get(elsewhere)
    if kept is not None:
        assert len([n for _, _, names in os.walk(kept) for n in names if n.endswith(".feedline-chunk")]) == 9


def test_a_cache_that_would_not_pay_is_not_used_and_the_decision_says_so(made, tmp_path, monkeypatch):
    import time

    read = cached_chunks.read

    def slow_device(*args, **kwargs):  # a cache device far slower than parsing
        time.sleep(0.05)
        return read(*args, **kwargs)

    monkeypatch.setattr(cached_chunks, "read", slow_device)
    path = copy(made, "day.tsv", tmp_path)
    plain = loader_of(copy(made, "day.tsv", tmp_path / "plain"), "off")
    expected = [epoch_digest(plain) for _ in range(2)]
    plain.close()
    counts = Counts(monkeypatch)
    loader = loader_of(path, "auto")
    assert [epoch_digest(loader) for _ in range(2)] == expected
    decision = loader.source.reader.cache_decision
    loader.close()
    assert not decision.use and decision.measured and decision.mode == "auto"
    assert decision.read_s > decision.recompute_s and "would not pay" in decision.reason
    assert counts.parsed > 9  # the second epoch parsed again
    assert chunk_files(path) == [] and not os.path.exists(tmp_path / ".day.tsv.feedline-tablecache")


def test_off_neither_writes_nor_reads_and_auto_leaves_a_table_held_in_memory_alone(made, tmp_path, monkeypatch):
    path = copy(made, "day.tsv", tmp_path)
    filled = loader_of(path, "on")
    expected = epoch_digest(filled)
    filled.close()
    before = {p: os.stat(p).st_mtime_ns for p in chunk_files(path)}
    counts = Counts(monkeypatch)
    off = loader_of(path, "off")
    assert epoch_digest(off) == expected
    off.close()
    parsed, read = counts.take()
    assert read == 0 and parsed >= 9
    assert {p: os.stat(p).st_mtime_ns for p in chunk_files(path)} == before

    small = copy(made, "day.tsv", tmp_path / "small")
    loader = Loader(criteo(small, on_error="skip"), batch_size=1024, cache="auto", placement="cpu")  # 2 x 65,536 rows in memory
    epoch_digest(loader)
    decision = loader.source.reader.cache_decision
    loader.close()
    assert not decision.use and "rows the Loader keeps in memory" in decision.reason
    assert chunk_files(small) == []


def test_chunks_written_by_each_rank_serve_the_next_run(made, tmp_path, monkeypatch):
    """Two files (plain and gzip) read as one table by two ranks, then by one."""
    path = [copy(made, "day.tsv", tmp_path), copy(made, "day.tsv.gz", tmp_path)]
    whole = loader_of([copy(made, name, tmp_path / "plain") for name in ("day.tsv", "day.tsv.gz")], "off")
    expected = epoch_digest(whole)
    whole.close()
    for rank in range(2):
        loader = loader_of(path, "on", rank=rank, world_size=2)
        epoch_digest(loader)
        loader.close()
    counts = Counts(monkeypatch)
    after = loader_of(path, "on")
    assert epoch_digest(after) == expected
    assert counts.take()[0] == 0  # every chunk of both files was written by one rank or the other
    assert len(chunk_files(path[0])) == len(chunk_files(path[1])) == 9
    after.close()


def test_float_string_and_list_columns_read_back_as_parsed(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    lines = ["clicked\tprice\tcountry\ttags\tage"]
    for i in range(30_000):
        price = "" if i % 7 == 0 else repr(float(rng.normal(50, 30)))
        tags = "|".join(str(t) for t in rng.integers(0, 10**9, rng.integers(0, 5)))
        age = "x" if i == 4_321 else ("" if i % 11 == 0 else str(int(rng.integers(-5, 90))))
        lines.append(f"{i % 2}\t{price}\t{rng.choice(['fr', 'de', 'us', 'été'])}\t{tags}\t{age}")
    (tmp_path / "t.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    columns = [Column("clicked", "int"), Column("price", "float"), Column("country", "string"),
               Column("tags", "int_list"), Column("age", "int")]
    schema = Schema(label="clicked", features=[Dense("price", clip_min=None, log1p=False), Dense("age"),
                                               Categorical("country", 100), MultiHot("tags", 1000, max_len=3)])
    spec = tabular(schema, TabularFiles(str(tmp_path / "t.tsv"), "tsv", columns, header=True, on_error="skip"))

    def run(cache):
        loader = Loader(spec, batch_size=1000, shuffle_buffer=1000, seed=1, cache=cache, placement="cpu")
        digests = [epoch_digest(loader) for _ in range(2)]
        skipped = [(s.where, s.reason) for s in loader.skipped]
        loader.close()
        return digests, skipped

    expected = run("off")
    assert run("on") == expected
    counts = Counts(monkeypatch)
    assert run("on") == expected and expected[1] and expected[1][0][0].endswith(":4323")
    assert counts.take()[0] == 0


def test_a_chunk_file_reads_back_the_values_it_was_given():
    """The encoding on its own: narrow and wide integers, floats with NaN, missing flags, bad rows and lists."""
    rows = 5
    ints = np.array([[0, -1, 2**40, 60_000, -30_000, 2**31, -2**31],  # uint8, int8, int64, uint16, int16,
                     [255, 7, -2**40, 1, 1, 1, 1],                       # uint32, int32
                     [3, 0, 0, 0, 0, 0, 0], [1, 1, 1, 2, 2, 2, 2], [2, 2, 2, 3, 3, 3, 3]], dtype=np.int64)
    floats = np.array([[0.5], [np.nan], [-1e300], [3.0], [0.0]])
    missing = np.zeros((rows, 8), dtype=bool)
    missing[1, 7] = missing[4, 0] = missing[0, 6] = True
    lists = {"tags": ListColumn(np.array([0, 2, 2, 3, 3, 5]), np.array([1, 2, 3, 4, 5]))}
    bad = np.array([False, False, True, False, False])
    parsed = cached_chunks.ParsedChunk(ints, floats, missing, lists, bad, {2: "column x: 'y' is not a number"})
    import tempfile

    key = b"k" * cached_chunks.KEY_BYTES
    with tempfile.TemporaryDirectory() as folder:
        cached_chunks.write(folder, 7, cached_chunks.encode(parsed, key, 1.5e-6))
        assert cached_chunks.read(folder, 7, b"x" * cached_chunks.KEY_BYTES, rows, 8, ("tags",)) is None
        assert cached_chunks.read(folder, 7, key, rows + 1, 8, ("tags",)) is None
        stored = cached_chunks.read(folder, 7, key, rows, 8, ("tags",))
    from feedline import ops

    assert [DTYPES[c].name for c in stored.block.layout[:, 0]] == [
        "uint8", "int8", "int64", "uint16", "int16", "uint32", "int32", "float64"]
    got_ints, got_floats, got_missing = ops.gather_raw(stored.block, np.arange(7), np.arange(7, 8), np.arange(rows))
    assert np.array_equal(got_ints, ints) and np.array_equal(got_missing, missing)
    assert np.array_equal(got_floats, floats, equal_nan=True)
    assert np.array_equal(stored.bad, bad) and stored.reasons == {2: "column x: 'y' is not a number"}
    assert np.array_equal(stored.lists["tags"].offsets, lists["tags"].offsets)
    assert np.array_equal(stored.lists["tags"].values, lists["tags"].values)
    assert stored.parse_s_per_row == 1.5e-6


def test_the_first_epoch_gathers_from_the_records_it_keeps(made, tmp_path):
    """A chunk parsed while the cache is written is held (and gathered from) in the records it is kept as, which
    the table's plan expects (``cached_row_bytes``), not in the wider parsed block."""
    path = copy(made, "day.tsv", tmp_path)
    loader = loader_of(path, CacheSettings(mode=CacheMode.ON))
    epoch_digest(loader)
    table = loader.source
    held = [c for c in (table._cache.cached(c) for c in range(len(table.chunk_rows))) if c is not None]
    loader.close()
    assert held and all((chunk.block.layout[:, 3] == BIT_FLAGS).all() for chunk in held)
    assert len(chunk_files(path)) == len(table.chunk_rows)


def test_each_column_is_kept_in_the_type_narrowest_gives():
    """The encoding's own choice of types (one kernel pass) agrees with ``columnar.narrowest`` on every bound."""
    edges = [0, 1, -1, 127, 128, -128, -129, 255, 256, 32_767, 32_768, -32_768, -32_769, 65_535, 65_536,
             2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**32 - 1, 2**32, -2**63, 2**63 - 1]
    pairs = [(a, b) for a in edges for b in edges if a <= b]
    ints = np.zeros((2, len(pairs)), np.int64)
    ints[0], ints[1] = [a for a, _ in pairs], [b for _, b in pairs]
    got = cached_chunks.layout_of(ints, 1).dtypes
    assert got == [narrowest(a, b) for a, b in pairs] + [np.dtype(np.float64)]
    assert cached_chunks.layout_of(ints[::-1].copy(), 0).dtypes == got[:-1]


def test_two_loaders_filling_one_cache_at_once(made, tmp_path, monkeypatch):
    """Two Loaders (as two ranks or runs would) parse and write the same chunks at the same time: each gets its
    own batches, and what they leave is whole chunks a third Loader reads without parsing."""
    import threading

    path = copy(made, "day.tsv.gz", tmp_path)
    plain = loader_of(copy(made, "day.tsv.gz", tmp_path / "plain"), "off")
    expected = [epoch_digest(plain) for _ in range(2)]
    plain.close()
    loaders = [loader_of(path, "on") for _ in range(2)]
    got = [None, None]

    def run(k):
        got[k] = [epoch_digest(loaders[k]) for _ in range(2)]

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for loader in loaders:
        loader.close()
    assert got == [expected, expected]
    counts = Counts(monkeypatch)
    third = loader_of(path, "on")
    assert epoch_digest(third) == expected[0] and counts.take()[0] == 0
    third.close()
    assert not [n for n in os.listdir(os.path.dirname(chunk_files(path)[0])) if n.endswith(".tmp")]
