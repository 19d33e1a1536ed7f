"""How a line of a text table is split and what each of its fields is (``TextSyntax``, ``Layout``): plain Python
and NumPy, so that a text table is declared and indexed without numba, whose import and first use take most of
a second; the parser's kernels (``text_parse``) load on a thread of their own meanwhile."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...pipelines.tabular import Column, ColumnKind

# Field kinds, as the kernel sees them.
SKIP, INT, HEX, FLOAT, STRING, LIST = 0, 1, 2, 3, 4, 5
KIND_CODES = {ColumnKind.INT: INT, ColumnKind.HEX: HEX, ColumnKind.FLOAT: FLOAT, ColumnKind.STRING: STRING,
              ColumnKind.INT_LIST: LIST}
# Byte classes.
ORD, DELIM, NEWLINE, CONTROL = 0, 1, 2, 3


@dataclass(frozen=True)
class TextSyntax:
    """How a line is split: the field ``delimiter`` byte, RFC 4180 ``quoting`` (CSV) or none (TSV), the
    ``list_delimiter`` inside list fields, and whether ``\\r\\n`` ends a line (``crlf``; else the ``\\r`` is a
    control character, as in TSV)."""

    delimiter: str = "\t"
    quoting: bool = False
    list_delimiter: str = "|"
    crlf: bool = False

    @property
    def delimiter_name(self) -> str:
        return {"\t": "tab", ",": "comma", ";": "semicolon", "|": "pipe", " ": "space"}.get(
            self.delimiter, repr(self.delimiter))


TSV = TextSyntax()
CSV = TextSyntax(delimiter=",", quoting=True, crlf=True)


class Layout:
    """What each field of a line is: ``fields[i]`` is the declared column read from field ``i``, or None for
    a field that is not read (a header's undeclared column; ``names[i]`` is then its header name). Columns
    go to blocks by kind in declaration order: integers (INT, HEX, STRING) to ``ints``, floats to
    ``floats``, lists to ``lists``."""

    def __init__(self, columns: tuple[Column, ...], syntax: TextSyntax = TSV,
                 fields: tuple[Column | None, ...] | None = None, names: tuple[str, ...] | None = None):
        fields = tuple(columns) if fields is None else tuple(fields)
        self.columns, self.syntax, self.fields = tuple(columns), syntax, fields
        self.names = tuple(c.name for c in fields) if names is None else tuple(names)
        self.int_columns = [c for c in columns if c.kind in (ColumnKind.INT, ColumnKind.HEX, ColumnKind.STRING)]
        self.float_columns = [c for c in columns if c.kind is ColumnKind.FLOAT]
        self.list_columns = [c for c in columns if c.kind is ColumnKind.INT_LIST]
        slot = {c.name: k for group in (self.int_columns, self.float_columns, self.list_columns)
                for k, c in enumerate(group)}
        self.kinds = np.array([SKIP if c is None else KIND_CODES[c.kind] for c in fields], dtype=np.int8)
        self.slots = np.array([-1 if c is None else slot[c.name] for c in fields], dtype=np.int64)
        self.seeds = np.array([0 if c is None else c.hash_seed for c in fields], dtype=np.int64)
        self.required = np.array([c is not None and c.required for c in fields], dtype=np.bool_)
        classes = np.zeros(256, dtype=np.uint8)
        classes[:0x20] = CONTROL
        classes[0x09] = ORD
        classes[0x0A] = NEWLINE
        classes[ord(syntax.delimiter)] = DELIM
        self.classes = classes
        self.delimiter = ord(syntax.delimiter)
        self.list_delimiter = ord(syntax.list_delimiter)
