"""A table cache's chunk read again in a later epoch (issue 18, GIL per batch): the chunk's key and file name are
worked out once per table, not per read, and a chunk file known from its write or a whole read is read back by
comparing its size, header and rest with what was known, not by decoding them again; a file that changed since
is decoded whole again (or parsed), with the same bits."""
from __future__ import annotations

import os

import numpy as np
import pytest

from feedline.loader.cache_policy import CacheMode, CacheSettings
from feedline.loader.sources import cached_chunks, chunked, open_source, table_cache, tsv
from feedline.pipelines.criteo import criteo
from feedline.loader.sources.table_rows import ListColumn

from test_table_cache import BAD_LINES, ROWS, chunk_files, copy, epoch_digest, loader_of, made  # noqa: F401

pytestmark = pytest.mark.usefixtures("fresh_index_store")


class Calls:
    """Calls of a few module functions, counted by wrapping them."""

    def __init__(self, monkeypatch, *where):
        self.counts = dict.fromkeys([name for _, name in where], 0)
        for module, name in where:
            monkeypatch.setattr(module, name, self._counted(name, getattr(module, name)))

    def _counted(self, name, real):
        def counted(*args, **kwargs):
            self.counts[name] += 1
            return real(*args, **kwargs)
        return counted

    def take(self) -> dict:
        got = dict(self.counts)
        self.counts = dict.fromkeys(self.counts, 0)
        return got


def test_later_epochs_read_chunks_without_working_out_keys_or_decoding_headers(made, tmp_path, monkeypatch):
    plain = loader_of(copy(made, "day.tsv", tmp_path / "plain"), "off")
    expected = [epoch_digest(plain) for _ in range(3)]
    plain.close()
    calls = Calls(monkeypatch, (table_cache, "_chunk_key"), (cached_chunks, "read"), (cached_chunks, "_rest"),
                  (cached_chunks, "_shape"))
    loader = loader_of(copy(made, "day.tsv", tmp_path / "cached"), "on")
    assert epoch_digest(loader) == expected[0]
    first = calls.take()
    assert first["_chunk_key"] == 9  # once a chunk
    assert [epoch_digest(loader) for _ in range(2)] == expected[1:]
    later = calls.take()
    loader.close()
    assert later["read"] >= 9 and later["_chunk_key"] == 0
    # Only the chunks holding a bad row (kept with a description, read whole) decode their header and rest.
    table = loader.source
    bad_chunks = set((np.searchsorted(table.first_row, np.array(BAD_LINES) - 1, side="right") - 1).tolist())
    assert 0 < len(bad_chunks) < 9 and later["_rest"] == later["_shape"] <= 2 * len(bad_chunks)


def _same(a, b) -> bool:
    return np.array_equal(a.bad, b.bad) and all(
        np.array_equal(a.columns[k].values, b.columns[k].values) and np.array_equal(a.columns[k].missing,
                                                                                    b.columns[k].missing)
        for k in a.columns)


def test_a_chunk_file_changed_under_a_table_is_read_whole_again_or_parsed(made, tmp_path, monkeypatch):
    path = copy(made, "day.tsv", tmp_path)
    monkeypatch.setattr(chunked, "CHUNKS_BEYOND", 3)  # room for three chunks in memory
    plain = open_source(criteo(path, on_error="skip").source, cache_rows=0, cache=CacheSettings(mode=CacheMode.OFF))
    table = open_source(criteo(path, on_error="skip").source, cache_rows=0, cache=CacheSettings(mode=CacheMode.ON))
    table.read(np.arange(ROWS))  # every chunk parsed and kept (its file known); three held in memory
    files = chunk_files(path)
    bad = set((np.searchsorted(table.first_row, np.array(BAD_LINES) - 1, side="right") - 1).tolist())
    assert len(files) == 9 and 0 in bad
    changed = [c for c in range(4, 9) if c not in bad][:3]  # chunks without bad rows (read whole every time)
    header = cached_chunks.HEADER
    with open(files[changed[0]], "r+b") as f:  # written again by another rank: another parse time in its header
        fields = list(header.unpack_from(f.read(header.size)))
        fields[7] *= 2
        f.seek(0)
        f.write(header.pack(*fields))
    with open(files[changed[1]], "r+b") as f:  # cut short
        f.truncate(os.path.getsize(files[changed[1]]) - 8)
    with open(files[changed[2]], "ab") as f:  # longer than its header says
        f.write(b"\0" * 8)
    rows = np.concatenate([np.arange(int(table.first_row[c]), int(table.first_row[c + 1])) for c in changed])
    expected = plain.read(rows)
    table.read(np.arange(int(table.first_row[3])))  # chunks 0-2 held: the others no longer
    assert sorted(table._cache) == [0, 1, 2]
    calls = Calls(monkeypatch, (tsv.TsvFormat, "parse"), (table_cache.TableCache, "_keep"), (cached_chunks, "_rest"))
    assert _same(table.read(rows), expected)
    assert calls.take() == {"parse": 2, "_keep": 2, "_rest": 1}  # the first read whole, the others parsed anew
    table.read(np.arange(int(table.first_row[3])))
    calls.take()
    assert _same(table.read(rows), expected)
    assert calls.take() == {"parse": 0, "_keep": 0, "_rest": 0}  # all three known again


def test_a_known_chunk_file_reads_back_what_a_whole_read_gives(tmp_path):
    rng = np.random.default_rng(1)
    rows = 50
    ints = rng.integers(-300, 300, size=(rows, 5)).astype(np.int64)
    floats = rng.standard_normal((rows, 2))
    parsed = cached_chunks.ParsedChunk(ints, floats, rng.random((rows, 7)) < 0.2, {}, np.zeros(rows, bool), {})
    key = b"k" * cached_chunks.KEY_BYTES
    folder = str(tmp_path)
    made = cached_chunks.encoded(parsed, key, 2e-6)
    size = cached_chunks.write(folder, 3, made.pieces)
    known = cached_chunks.Known()
    cached_chunks.note_written(known, folder, 3, key, size, made, 2e-6)
    whole = cached_chunks.read(folder, 3, key, rows, 7, ())
    again = cached_chunks.read(folder, 3, key, rows, 7, (), known)
    assert known.noted is not None and again.block.data.tobytes() == whole.block.data.tobytes()
    assert np.array_equal(again.block.layout, whole.block.layout) and again.block.rows == rows
    assert (again.parse_s_per_row, again.nbytes, again.bad.any(), again.reasons) == (2e-6, size, False, {})
    # Asked with another key or rows: not this chunk, whatever is known.
    assert cached_chunks.read(folder, 3, b"x" * cached_chunks.KEY_BYTES, rows, 7, (), known) is None
    assert cached_chunks.read(folder, 3, key, rows + 1, 7, (), known) is None
    # A chunk with bad rows or list columns is not noted: read whole each time.
    bad = np.zeros(rows, bool)
    bad[4] = True
    listed = parsed._replace(bad=bad, reasons={4: "why"},
                             lists={"tags": ListColumn(np.arange(rows + 1), np.arange(rows))})
    made = cached_chunks.encoded(listed, key, 2e-6)
    size = cached_chunks.write(folder, 4, made.pieces)
    other = cached_chunks.Known()
    cached_chunks.note_written(other, folder, 4, key, size, made, 2e-6)
    assert other.noted is None
    stored = cached_chunks.read(folder, 4, key, rows, 7, ("tags",), other)
    assert other.noted is None and stored.reasons == {4: "why"} and np.array_equal(stored.lists["tags"].values,
                                                                                     np.arange(rows))


def test_the_chunk_parsed_for_the_plan_is_not_parsed_again(made, tmp_path, monkeypatch):
    calls = Calls(monkeypatch, (tsv.TsvFormat, "parse"))
    plain = loader_of(copy(made, "day.tsv", tmp_path / "plain"), "off")
    expected = epoch_digest(plain)
    plain.close()
    calls.take()
    path = copy(made, "day.tsv", tmp_path / "cached")
    loader = loader_of(path, "on")
    assert loader.source.cached_row_bytes < 9 * 40  # its plan made from chunk 0's narrow records (parsed for it)
    assert calls.take()["parse"] == 1
    assert epoch_digest(loader) == expected
    assert calls.take()["parse"] == 8 and len(chunk_files(path)) == 9  # chunk 0's parse used, not made again
    head = open(chunk_files(path)[0], "rb").read(cached_chunks.HEADER.size)
    assert cached_chunks.HEADER.unpack(head)[7] > 0  # the seconds a row took to parse, its parse at opening counted
    loader.close()
