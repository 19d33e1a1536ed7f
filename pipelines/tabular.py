"""Tabular feature pipelines declared from a schema: dense columns (fill, clip, log1p, bucketize), categorical
columns and crosses (hashed to buckets), multi-hot list columns (hashed, truncated, jagged).

``tabular(schema, source)`` returns a :class:`PipelineSpec` with these stages, in order, each present only
when the schema needs it:

==========  ======  ==========================================================================================
stage       where   what
==========  ======  ==========================================================================================
parse       CPU     rows of the files -> ``label``, ``dense_raw`` (float64 [D, B], NaN = missing),
                    ``categorical_raw`` (int64 [K, B], missing = ``MISSING_ID``), ``lists_raw``
dense       both    fill, clip, log1p -> ``dense`` (float32 [B, D']); bucketized columns -> ``bucketized``
hash        both    categoricals and crosses -> ``categorical_ids`` (int64 [C + X, B])
multi_hot   both    list columns -> ``multi_hot_ids`` (one jagged array per column)
assemble    both    every sparse key -> ``sparse`` in TorchRec KeyedJaggedTensor layout (key-major)
==========  ======  ==========================================================================================

Placement follows the single-cut rule of :mod:`pipelines.spec`: ``parse`` always runs on the CPU, so the valid
cuts are 1 (everything after parsing on the GPU) to ``len(stages)`` (all on the CPU), and a batch crosses to
the GPU once.

A missing categorical value is hashed as the int64 value ``MISSING_ID`` (-1): it gets a bucket of its own
like any other value (it may share that bucket with real values, as any hashed value may), and CPU, GPU and
serving agree on it.

Files (:class:`TabularFiles`): TSV and CSV text (plain or gzip, with or without a header row), Parquet, and
folders written by ``feedline convert``. In text, an empty field is a missing value; ``INT`` is
``-?[0-9]+`` within int64, ``HEX`` is ``[0-9a-fA-F]+`` up to ``7fffffffffffffff``, ``FLOAT`` is what Python's
``float()`` reads (correctly rounded; NaN is missing, +-inf a bad row), ``STRING`` is any text (its UTF-8
bytes are hashed), ``INT_LIST`` is decimal integers separated by ``list_delimiter`` (an empty field is an empty
list). CSV follows RFC 4180 within a line (``"a,b"``, ``""`` for a quote inside; a line may end in ``\r\n``);
TSV has no quoting and a ``\r`` is a bad row. A bad row (wrong field count, a control character, a malformed
value or quote, a required value empty) raises or is skipped by ``on_error``.

A ``STRING`` categorical gets the bucket ``ops.hash_buckets`` gives its UTF-8 strings with the Categorical's
seed: the source keeps each string as the int64 key (low 32 bits zero) whose MurmurHash3 with that seed is
the string's, so the hash stage treats it as any id. A Cross over a string column hashes those keys (seed 0
for a string column no Categorical names).
"""
from __future__ import annotations

import enum
import math
import os
from dataclasses import dataclass, replace
from typing import Sequence, Union

import numpy as np

from ..ops import MAX_NUM_BUCKETS, MAX_SEED
from .choices import parse_enum
from .on_error import OnError
from .spec import PipelineSpec
from .validate import int_in
from .features import MISSING_ID, AssembleSparse, DenseColumns, HashColumns, MultiHotColumns, Parse  # noqa: F401  (MISSING_ID: public here)


class FileFormat(enum.Enum):
    TSV = "tsv"    # delimited text without quoting (tab by default)
    CSV = "csv"    # delimited text with RFC 4180 quotes (comma by default)
    PARQUET = "parquet"
    COLUMNAR = "columnar"  # a folder written by ``feedline convert``


class ColumnKind(enum.Enum):
    """How a column is stored. Text and Parquet files hold any kind (in Parquet, ``HEX`` accepts hex strings
    or integers); converted tables hold ``INT`` and ``HEX``. ``STRING`` is a categorical read as its UTF-8
    bytes and kept as their MurmurHash3 (see :class:`Column`)."""

    INT = "int"
    FLOAT = "float"
    HEX = "hex"
    STRING = "string"
    INT_LIST = "int_list"


TEXT_FORMATS = frozenset({FileFormat.TSV, FileFormat.CSV})
COLUMNAR_KINDS = frozenset({ColumnKind.INT, ColumnKind.HEX})
DENSE_KINDS = frozenset({ColumnKind.INT, ColumnKind.FLOAT})
CATEGORICAL_KINDS = frozenset({ColumnKind.INT, ColumnKind.HEX, ColumnKind.STRING})
LABEL_KINDS = frozenset({ColumnKind.INT, ColumnKind.FLOAT})


def _name(owner: str, field_name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{owner}.{field_name} must be a non-empty string, got {value!r}")
    return value


def _integer(owner: str, field_name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{owner}.{field_name} must be an integer, got {type(value).__name__} {value!r}")
    return int_in(f"{owner}.{field_name}", value, low, high)


def _finite(owner: str, field_name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{owner}.{field_name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{owner}.{field_name} must be finite, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Column:
    """One column of the files. ``required``: an empty value makes the row bad (set for the label).
    ``hash_seed``: for a ``STRING`` column, the seed of the MurmurHash3_x86_32 its values are read as (an int64
    in [0, 2^32)); :func:`tabular` sets it to the seed of the column's ``Categorical`` (0 without one)."""

    name: str
    kind: ColumnKind
    required: bool = False
    hash_seed: int = 0

    def __post_init__(self) -> None:
        _name("Column", "name", self.name)
        object.__setattr__(self, "kind", parse_enum(ColumnKind, "Column.kind", self.kind))
        if not isinstance(self.required, bool):
            raise TypeError(f"Column.required must be True or False, got {self.required!r}")
        _integer("Column", "hash_seed", self.hash_seed, 0, MAX_SEED)


def _delimiter(field_name: str, value: object, default: str) -> str:
    """A delimiter: one ASCII character that cannot be part of a value (a tab, a space or punctuation, but not
    a quote or a character of a number)."""
    if value is None:
        return default
    if not isinstance(value, str) or len(value) != 1:
        raise TypeError(f"TabularFiles.{field_name} must be one character, got {value!r}")
    if not (value == "\t" or (" " <= value <= "~" and not value.isalnum() and value not in '"-+.')):
        raise ValueError(f"TabularFiles.{field_name} must be a tab, a space or ASCII punctuation other than "
                         f"'\"', '-', '+' and '.', got {value!r}")
    return value


@dataclass(frozen=True)
class TabularFiles:
    """The files a tabular pipeline reads, in order: row ``i`` of the data set counts over all files.

    For text files (TSV, CSV): ``header``: the first line of each file names its fields, and ``columns`` are
    taken by name (in any order, others ignored; every file must have the same header); without it ``columns``
    are the fields of each line, in order. ``delimiter``: between fields (None: tab for TSV, comma for CSV).
    ``list_delimiter``: between the elements of an ``INT_LIST`` field (None: ``|``). Other formats take none
    of these. ``on_error``: ``"raise"`` (a ``DataError`` naming ``file:line``) or ``"skip"`` (the row delivered
    as an invalid slot, ``valid`` False, and listed once in ``Loader.skipped``); a table takes it here, since
    its rows are checked as the files are read (a Loader given another one says so)."""

    paths: tuple[str, ...]
    format: FileFormat
    columns: tuple[Column, ...]
    on_error: OnError = OnError.RAISE
    header: bool = False
    delimiter: str | None = None
    list_delimiter: str | None = None

    def __post_init__(self) -> None:
        paths = (self.paths,) if isinstance(self.paths, (str, os.PathLike)) else self.paths
        if not isinstance(paths, Sequence) or not paths:
            raise TypeError(f"TabularFiles.paths must be a path or a non-empty sequence of paths, got {self.paths!r}")
        for p in paths:
            if not isinstance(p, (str, os.PathLike)):
                raise TypeError(f"TabularFiles.paths must hold paths, got {type(p).__name__} {p!r}")
        object.__setattr__(self, "paths", tuple(os.fspath(p) for p in paths))
        object.__setattr__(self, "format", parse_enum(FileFormat, "TabularFiles.format", self.format))
        object.__setattr__(self, "on_error", parse_enum(OnError, "TabularFiles.on_error", self.on_error))
        if not isinstance(self.columns, Sequence) or not self.columns:
            raise TypeError(f"TabularFiles.columns must be a non-empty sequence of Column, got {self.columns!r}")
        for c in self.columns:
            if not isinstance(c, Column):
                raise TypeError(f"TabularFiles.columns must hold Column, got {type(c).__name__} {c!r}")
        object.__setattr__(self, "columns", tuple(self.columns))
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"TabularFiles.columns: names repeat: {names}")
        if self.format is FileFormat.COLUMNAR:
            bad = [c.name for c in self.columns if c.kind not in COLUMNAR_KINDS]
            if bad:
                raise TypeError(f"TabularFiles.columns {bad}: converted tables hold only int and hex columns")
        self._check_text_options()

    def _check_text_options(self) -> None:
        if not isinstance(self.header, bool):
            raise TypeError(f"TabularFiles.header must be True or False, got {self.header!r}")
        if self.format not in TEXT_FORMATS:
            given = [f for f, v in (("header", self.header), ("delimiter", self.delimiter),
                                    ("list_delimiter", self.list_delimiter)) if v not in (False, None)]
            if given:
                raise ValueError(f"TabularFiles.{given[0]} applies to TSV and CSV files only, not to "
                                 f"{self.format.value}")
            return
        delimiter = _delimiter("delimiter", self.delimiter, "\t" if self.format is FileFormat.TSV else ",")
        listed = _delimiter("list_delimiter", self.list_delimiter, "|")
        if delimiter == listed:
            raise ValueError(f"TabularFiles.list_delimiter must differ from TabularFiles.delimiter, both are "
                             f"{delimiter!r}")
        object.__setattr__(self, "delimiter", delimiter)
        object.__setattr__(self, "list_delimiter", listed)

    @property
    def produces(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)


@dataclass(frozen=True)
class Dense:
    """A numeric column -> ``dense``: missing becomes ``fill``, then values below ``clip_min`` are raised to
    it (None: no clipping), then ``log1p`` if set. With ``boundaries`` (strictly increasing), the value after
    those steps is bucketized instead (bucket i holds values in [boundaries[i-1], boundaries[i])): such a Dense
    is not a column of ``dense`` but a sparse key named ``name`` (one id per row, ``len(boundaries) + 1``
    buckets), at its place among the schema's sparse keys."""

    name: str
    fill: float = 0.0
    clip_min: float | None = 0.0
    log1p: bool = True
    boundaries: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        _name("Dense", "name", self.name)
        object.__setattr__(self, "fill", _finite("Dense", "fill", self.fill))
        if self.clip_min is not None:
            object.__setattr__(self, "clip_min", _finite("Dense", "clip_min", self.clip_min))
        if not isinstance(self.log1p, bool):
            raise TypeError(f"Dense.log1p must be True or False, got {self.log1p!r}")
        if self.boundaries is not None:
            if isinstance(self.boundaries, (str, bytes)) or not isinstance(self.boundaries, (Sequence, np.ndarray)):
                raise TypeError(f"Dense.boundaries must be a sequence of numbers or None, got {self.boundaries!r}")
            values = tuple(_finite("Dense", "boundaries", b) for b in self.boundaries)
            if not values:
                raise ValueError("Dense.boundaries must hold at least one value, got an empty sequence")
            if any(b <= a for a, b in zip(values, values[1:])):
                raise ValueError(f"Dense.boundaries must be strictly increasing, got {values}")
            object.__setattr__(self, "boundaries", values)

    @property
    def bucketized(self) -> bool:
        return self.boundaries is not None


@dataclass(frozen=True)
class Categorical:
    """An int or hex column hashed to ``num_buckets`` buckets with ``seed``; one id per row."""

    name: str
    num_buckets: int
    seed: int = 0

    def __post_init__(self) -> None:
        _name("Categorical", "name", self.name)
        _integer("Categorical", "num_buckets", self.num_buckets, 1, MAX_NUM_BUCKETS)
        _integer("Categorical", "seed", self.seed, 0, MAX_SEED)


@dataclass(frozen=True)
class MultiHot:
    """A list-of-int column: each element hashed to ``num_buckets`` with ``seed``, lists cut to ``max_len``
    (None: no limit); a missing list is empty."""

    name: str
    num_buckets: int
    seed: int = 0
    max_len: int | None = None

    def __post_init__(self) -> None:
        _name("MultiHot", "name", self.name)
        _integer("MultiHot", "num_buckets", self.num_buckets, 1, MAX_NUM_BUCKETS)
        _integer("MultiHot", "seed", self.seed, 0, MAX_SEED)
        if self.max_len is not None:
            _integer("MultiHot", "max_len", self.max_len, 1, 1 << 31)


@dataclass(frozen=True)
class Cross:
    """The pair of categorical columns ``a`` and ``b`` hashed together to ``num_buckets``; key ``a_x_b``."""

    a: str
    b: str
    num_buckets: int
    seed: int = 0

    def __post_init__(self) -> None:
        _name("Cross", "a", self.a)
        _name("Cross", "b", self.b)
        if self.a == self.b:
            raise ValueError(f"Cross.a and Cross.b must name different columns, got {self.a!r} twice")
        _integer("Cross", "num_buckets", self.num_buckets, 1, MAX_NUM_BUCKETS)
        _integer("Cross", "seed", self.seed, 0, MAX_SEED)

    @property
    def name(self) -> str:
        return f"{self.a}_x_{self.b}"


Feature = Union[Dense, Categorical, MultiHot, Cross]


@dataclass(frozen=True)
class Schema:
    """The label column (None: no label) and the features, in the order their outputs appear."""

    label: str | None
    features: tuple[Feature, ...]

    def __post_init__(self) -> None:
        if self.label is not None:
            _name("Schema", "label", self.label)
        if not isinstance(self.features, (Sequence, tuple)) or isinstance(self.features, str) or not self.features:
            raise TypeError(f"Schema.features must be a non-empty sequence of Dense, Categorical, MultiHot or "
                            f"Cross, got {self.features!r}")
        for f in self.features:
            if not isinstance(f, (Dense, Categorical, MultiHot, Cross)):
                raise TypeError(f"Schema.features must hold Dense, Categorical, MultiHot or Cross, "
                                f"got {type(f).__name__} {f!r}")
        object.__setattr__(self, "features", tuple(self.features))
        names = [f.name for f in self.features]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"Schema.features: output names repeat: {repeated}")
        if self.label is not None and self.label in names:
            raise ValueError(f"Schema.label {self.label!r} is also a feature")

    def of_type(self, kind: type) -> tuple:
        return tuple(f for f in self.features if isinstance(f, kind))

    @property
    def dense(self) -> tuple[Dense, ...]:
        return tuple(f for f in self.of_type(Dense) if not f.bucketized)

    @property
    def bucketized(self) -> tuple[Dense, ...]:
        return tuple(f for f in self.of_type(Dense) if f.bucketized)

    @property
    def sparse_keys(self) -> tuple[str, ...]:
        """Every sparse key, in the order of ``features``: each Categorical, Cross, MultiHot and bucketized Dense
        (a Dense with boundaries is a sparse key, not a ``dense`` column), so embedding tables can be matched
        to keys by position."""
        return tuple(f.name for f in self.features if not isinstance(f, Dense) or f.bucketized)


def tabular(schema: Schema, source: TabularFiles, *, name: str = "tabular") -> PipelineSpec:
    """The pipeline that turns ``source``'s rows into ``label``, ``dense`` and ``sparse`` as ``schema`` says."""
    if not isinstance(schema, Schema):
        raise TypeError(f"schema must be a Schema, got {type(schema).__name__}")
    if not isinstance(source, TabularFiles):
        raise TypeError(f"source must be TabularFiles, got {type(source).__name__}")
    _check_columns(schema, source)
    seeds = {f.name: f.seed for f in schema.of_type(Categorical)}
    columns = tuple(replace(c, required=c.required or c.name == schema.label,
                            hash_seed=seeds.get(c.name, 0) if c.kind is ColumnKind.STRING else c.hash_seed)
                    for c in source.columns)
    if columns != source.columns:
        source = replace(source, columns=columns)

    dense = schema.dense + schema.bucketized
    categorical = schema.of_type(Categorical)
    crosses = schema.of_type(Cross)
    multi_hot = schema.of_type(MultiHot)
    raw_ids = tuple(dict.fromkeys([f.name for f in categorical] + [c for x in crosses for c in (x.a, x.b)]))

    parse_out = (("label",) if schema.label else ()) + (("dense_raw",) if dense else ()) \
        + (("categorical_raw",) if raw_ids else ()) + (("lists_raw",) if multi_hot else ())
    stages: list = [Parse(source.produces, parse_out, schema.label, tuple(f.name for f in dense), raw_ids,
                          tuple(f.name for f in multi_hot))]
    sparse_inputs: list[str] = []
    if dense:
        produces = (("dense",) if schema.dense else ()) + (("bucketized",) if schema.bucketized else ())
        stages.append(DenseColumns(("dense_raw",), produces, schema.dense, schema.bucketized))
        sparse_inputs += ["bucketized"] if schema.bucketized else []
    # Where each sparse key's ids are, in schema order; hashed keys are hashed into rows in that order too.
    hashed = [f for f in schema.features if isinstance(f, (Categorical, Cross))]
    sources = tuple(("categorical_ids", hashed.index(f)) if isinstance(f, (Categorical, Cross)) else
                    ("multi_hot_ids", multi_hot.index(f)) if isinstance(f, MultiHot) else
                    ("bucketized", schema.bucketized.index(f))
                    for f in schema.features if not isinstance(f, Dense) or f.bucketized)
    if categorical or crosses:
        rows = {n: i for i, n in enumerate(raw_ids)}
        stages.append(HashColumns(("categorical_raw",), ("categorical_ids",),
                                  tuple((rows[f.name], f.num_buckets, f.seed) for f in categorical),
                                  tuple((rows[x.a], rows[x.b], x.num_buckets, x.seed) for x in crosses),
                                  tuple(hashed.index(f) for f in (*categorical, *crosses))))
        sparse_inputs.append("categorical_ids")
    if multi_hot:
        stages.append(MultiHotColumns(("lists_raw",), ("multi_hot_ids",), multi_hot))
        sparse_inputs.append("multi_hot_ids")
    outputs = (("label",) if schema.label else ()) + (("dense",) if schema.dense else ())
    if sparse_inputs:
        stages.append(AssembleSparse(tuple(sparse_inputs), ("sparse",), schema.sparse_keys, sources))
        outputs += ("sparse",)
    if not outputs:
        raise ValueError("schema produces no outputs")
    return PipelineSpec(name, source, tuple(stages), outputs)


def _check_columns(schema: Schema, source: TabularFiles) -> None:
    kinds = {c.name: c.kind for c in source.columns}

    def need(column: str, allowed: frozenset, what: str) -> None:
        if column not in kinds:
            raise ValueError(f"{what} reads column {column!r}, which the files do not declare; "
                             f"columns: {list(kinds)}")
        if kinds[column] not in allowed:
            raise TypeError(f"{what} needs column {column!r} to be {sorted(k.value for k in allowed)}, "
                            f"but it is declared {kinds[column].value}")

    if schema.label is not None:
        need(schema.label, LABEL_KINDS, "Schema.label")
    for f in schema.features:
        if isinstance(f, Dense):
            need(f.name, DENSE_KINDS, f"Dense({f.name!r})")
        elif isinstance(f, Categorical):
            need(f.name, CATEGORICAL_KINDS, f"Categorical({f.name!r})")
        elif isinstance(f, MultiHot):
            need(f.name, frozenset({ColumnKind.INT_LIST}), f"MultiHot({f.name!r})")
        else:
            need(f.a, CATEGORICAL_KINDS, f"Cross({f.a!r}, {f.b!r})")
            need(f.b, CATEGORICAL_KINDS, f"Cross({f.a!r}, {f.b!r})")
