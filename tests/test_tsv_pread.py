"""A plain TSV chunk is read by ``pread`` into the very bytes the parser gets (no copy of ~1 MiB a chunk)."""
import numpy as np
import pytest

from feedline.loader.sources import tsv
from feedline.loader.sources.table_rows import RowError
from feedline.pipelines.tabular import Column, ColumnKind

COLUMNS = (Column("d", ColumnKind.INT, required=True), Column("h", ColumnKind.HEX))


@pytest.fixture
def file(tmp_path):
    path = tmp_path / "t.tsv"
    path.write_bytes(b"".join(f"{k}\t{k:x}\n".encode() for k in range(300_000)))  # ~3.5 MB: several chunks
    return str(path)


def test_a_later_chunk_is_parsed_from_the_bytes_pread_made(file, monkeypatch):
    fmt = tsv.TsvFormat(COLUMNS)
    index = fmt.index(file)
    assert index.rows.size >= 3
    made, parsed = [], []
    real_pread, real_parse = tsv.os.pread, fmt.parse

    def pread(fd, n, offset):
        made.append(real_pread(fd, n, offset))
        return made[-1]

    def parse(data, rows):
        parsed.append(data)
        return real_parse(data, rows)

    monkeypatch.setattr(tsv.os, "pread", pread)
    monkeypatch.setattr(fmt, "parse", parse)
    for chunk in (0, 1, index.rows.size - 1):
        made.clear()
        rows = fmt.load(file, index, chunk)
        assert any(parsed[-1] is data for data in made)  # the read's own object, not a slice copied from it
        first = int(index.lines[chunk]) - 1
        assert np.array_equal(rows.ints[:, 0], np.arange(first, first + int(index.rows[chunk])))


def test_a_chunk_that_no_longer_starts_a_line_raises(file):
    fmt = tsv.TsvFormat(COLUMNS)
    index = fmt.index(file)
    start = int(index.starts[1])
    with open(file, "r+b") as f:  # the byte before chunk 1 is no longer a line end (same size, same lines)
        f.seek(start - 1)
        f.write(b"7")
        f.seek(start - 2)
        f.write(b"\n")
    with pytest.raises(RowError, match="changed since it was indexed"):
        fmt.load(file, index, 1)
