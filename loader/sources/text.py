"""Text tables (TSV, CSV) as a ``TabularFiles`` declares them: the lines cut and read as ``tsv.TsvFormat`` does,
split with the declared syntax, and, for files with a header row, the declared columns found by name.

A header is the first line of each file: it names the fields (CSV quotes allowed; a UTF-8 byte order mark and,
for CSV, a ``\\r`` before the newline are taken off). Every declared column must be among them and every file
must have the same header; the fields no column names are split but not read. The header is not a row: the
first row of a file is its line 2, and errors name it so.
"""
from __future__ import annotations

import csv
import gzip
import threading
import zlib

from ...pipelines.tabular import FileFormat, TabularFiles
from .chunked import ChunkIndex
from .line_index import MAX_LINE_BYTES
from .table_rows import RowError
from .text_syntax import Layout, TextSyntax
from .tsv import TsvFormat, is_gzip


def syntax_of(files: TabularFiles) -> TextSyntax:
    csv_ = files.format is FileFormat.CSV
    return TextSyntax(delimiter=files.delimiter, quoting=csv_, list_delimiter=files.list_delimiter, crlf=csv_)


class TextFormat(TsvFormat):
    """The chunks of TSV or CSV files, parsed natively (``text_parse``) into the declared columns."""

    def __init__(self, files: TabularFiles):
        super().__init__(files.columns, syntax_of(files))
        self.header = files.header
        self._first: tuple[str, tuple[str, ...]] | None = None  # the first file read and its header
        threading.Thread(target=_warm_up, name="feedline-parser-warm-up", daemon=True).start()  # while indexing

    def index(self, path: str) -> ChunkIndex:
        index = super().index(path)
        if not self.header or not index.rows.size:
            return index
        names, size = read_header(path, self.layout.syntax)
        self._use_header(path, names)
        return without_first_line(index, size)

    def _use_header(self, path: str, names: tuple[str, ...]) -> None:
        if self._first is not None:
            first, first_names = self._first
            if names != first_names:
                raise RowError(path, 1, f"the header {list(names)} differs from {first}'s {list(first_names)}; "
                                        f"files read together must have the same header")
            return
        declared = {c.name: c for c in self.columns}
        absent = [name for name in declared if name not in names]
        if absent:
            raise RowError(path, 1, f"the header has no column(s) {absent}; its fields are {list(names)}")
        twice = sorted({n for n in names if n in declared and names.count(n) > 1})
        if twice:
            raise RowError(path, 1, f"the header names column(s) {twice} more than once")
        self.layout = Layout(self.columns, self.layout.syntax, tuple(declared.get(n) for n in names), names)
        self._first = (path, names)


def _warm_up() -> None:
    """numba imported and the parser's kernel loaded (``text_parse.warm_up``), off the thread that indexes."""
    from .text_parse import warm_up

    warm_up()


def read_header(path: str, syntax: TextSyntax) -> tuple[tuple[str, ...], int]:
    """The field names on a file's first line, and that line's length in bytes (its newline included)."""
    try:
        if is_gzip(path):
            with gzip.open(path, "rb") as f:
                head = f.read(MAX_LINE_BYTES + 1)
        else:
            with open(path, "rb") as f:
                head = f.read(MAX_LINE_BYTES + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise RowError(path, 1, f"the header cannot be read: {e}") from None
    end = head.find(b"\n")
    if end < 0 and len(head) > MAX_LINE_BYTES:
        raise RowError(path, 1, f"the header is longer than the {MAX_LINE_BYTES} bytes a line may have")
    size = len(head) if end < 0 else end + 1
    line = head[:size].rstrip(b"\n")
    if syntax.crlf and line.endswith(b"\r"):
        line = line[:-1]
    try:
        text = line.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise RowError(path, 1, f"the header is not UTF-8 text: {e}") from None
    if syntax.quoting:
        try:
            rows = list(csv.reader([text], delimiter=syntax.delimiter, quotechar='"', strict=True))
        except csv.Error as e:
            raise RowError(path, 1, f"the header is not a CSV line: {e}") from None
        names = tuple(rows[0]) if rows else ("",)
    else:
        names = tuple(text.split(syntax.delimiter))
    return names, size


def without_first_line(index: ChunkIndex, size: int) -> ChunkIndex:
    """``index`` less its first line (``size`` bytes): the first chunk starts after it, at line 2."""
    starts, stops, lines, rows, groups = (a.copy() for a in (index.starts, index.stops, index.lines, index.rows,
                                                              index.groups))
    starts[0] += size
    lines[0] += 1
    rows[0] -= 1
    if rows[0] == 0:
        return ChunkIndex(starts[1:], stops[1:], lines[1:], rows[1:], groups[1:])
    return ChunkIndex(starts, stops, lines, rows, groups)
