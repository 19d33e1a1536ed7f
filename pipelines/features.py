"""The stages of a tabular feature pipeline, each with one implementation that runs on NumPy (CPU) or CuPy
(GPU): ``run(data, xp)`` takes the batch's arrays so far and returns the ones it produces.

Arrays are feature-major (``[features, rows]``) until ``dense`` transposes its output to ``[rows, features]``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .. import ops
from .stage import BOTH, CPU_ONLY, Stage

MISSING_ID = -1


@dataclass(frozen=True)
class FeatureStage(Stage):
    consumes: tuple[str, ...]
    produces: tuple[str, ...]
    backends = BOTH

    def run(self, data: Mapping[str, Any], xp) -> dict[str, Any]:
        raise NotImplementedError

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class Parse(FeatureStage):
    """The rows the source read (``data["columns"]``: name -> values and missing mask) -> ``label`` float32
    [B], ``dense_raw`` float32 [D, B] (NaN = missing), ``categorical_raw`` int64 [K, B] (missing =
    ``MISSING_ID``), ``lists_raw`` (one list column per multi-hot feature). CPU only: it reads the source."""

    label: str | None
    dense: tuple[str, ...]
    categorical: tuple[str, ...]
    lists: tuple[str, ...]
    name = "parse"
    backends = CPU_ONLY

    def describe(self) -> str:
        return "read the rows' columns: label, dense, ids, lists"

    def run(self, data, xp=np) -> dict[str, Any]:
        columns = data["columns"]
        out: dict[str, Any] = {}
        if self.label is not None:
            out["label"] = columns[self.label].values.astype(np.float32)
        if self.dense:
            raw = np.stack([columns[name].values for name in self.dense]).astype(np.float32)
            raw[np.stack([columns[name].missing for name in self.dense])] = np.nan
            out["dense_raw"] = raw
        if self.categorical:
            ids = np.stack([columns[name].values for name in self.categorical])
            ids[np.stack([columns[name].missing for name in self.categorical])] = MISSING_ID
            out["categorical_raw"] = ids
        if self.lists:
            out["lists_raw"] = tuple(columns[name] for name in self.lists)
        return out


@dataclass(frozen=True)
class DenseColumns(FeatureStage):
    """``dense_raw`` -> ``dense`` float32 [B, D] (fill, clip, log1p per column) and ``bucketized`` int64 [K, B]
    for the columns with boundaries (the same steps, then ``ops.bucketize``)."""

    dense: tuple  # Dense declarations without boundaries, in output order
    bucketized: tuple  # Dense declarations with boundaries
    name = "dense"

    def describe(self) -> str:
        return "fill, clip, log1p; bucketize"

    def run(self, data, xp) -> dict[str, Any]:
        raw = data["dense_raw"]
        out: dict[str, Any] = {}
        if self.dense:
            groups: dict[tuple, list[int]] = {}
            for i, f in enumerate(self.dense):
                groups.setdefault((f.fill, f.clip_min, f.log1p), []).append(i)
            normalize = ops.normalize_dense if xp is not np else normalize_dense_memo
            if len(groups) == 1:
                (fill, clip, log), = groups
                normalized = normalize(raw[:len(self.dense)], fill, clip, log)
            else:
                normalized = xp.empty((len(self.dense), raw.shape[1]), dtype=np.float32)
                for (fill, clip, log), rows in groups.items():
                    normalized[rows] = normalize(raw[rows], fill, clip, log)
            out["dense"] = xp.ascontiguousarray(normalized.T)
        if self.bucketized:
            ids = xp.empty((len(self.bucketized), raw.shape[1]), dtype=np.int64)
            for k, f in enumerate(self.bucketized):
                value = ops.normalize_dense(raw[len(self.dense) + k], f.fill, f.clip_min, f.log1p)
                ids[k] = ops.bucketize(value, xp.asarray(f.boundaries, dtype=np.float64))
            out["bucketized"] = ids
        return out


@dataclass(frozen=True)
class HashColumns(FeatureStage):
    """``categorical_raw`` -> ``categorical_ids`` int64 [C + X, B]: each categorical ``(row, buckets, seed)``
    hashed with ``ops.hash_buckets``, then each cross ``(row_a, row_b, buckets, seed)`` with ``ops.cross``."""

    categorical: tuple[tuple[int, int, int], ...]
    crosses: tuple[tuple[int, int, int, int], ...]
    name = "hash"

    def describe(self) -> str:
        return "MurmurHash3 ids and crosses to buckets"

    def run(self, data, xp) -> dict[str, Any]:
        raw = data["categorical_raw"]
        ids = xp.empty((len(self.categorical) + len(self.crosses), raw.shape[1]), dtype=np.int64)
        for k, (row, num_buckets, seed) in enumerate(self.categorical):
            ids[k] = ops.hash_buckets(raw[row], num_buckets, seed)
        for k, (a, b, num_buckets, seed) in enumerate(self.crosses, start=len(self.categorical)):
            ids[k] = ops.cross(raw[a], raw[b], num_buckets, seed)
        return {"categorical_ids": ids}


@dataclass(frozen=True)
class MultiHotColumns(FeatureStage):
    """``lists_raw`` -> ``multi_hot_ids``: each list column hashed, truncated and jagged (``ops.multi_hot``)."""

    columns: tuple  # MultiHot declarations
    name = "multi_hot"

    def describe(self) -> str:
        return "hash and truncate list columns (jagged)"

    def run(self, data, xp) -> dict[str, Any]:
        return {"multi_hot_ids": tuple(ops.multi_hot(col.offsets, col.values, f.num_buckets, f.seed, f.max_len)
                                       for col, f in zip(data["lists_raw"], self.columns, strict=True))}


@dataclass(frozen=True)
class AssembleSparse(FeatureStage):
    """Every sparse key -> ``sparse`` in TorchRec's key-major ``KeyedJaggedTensor`` layout."""

    keys: tuple[str, ...]
    name = "assemble"

    def describe(self) -> str:
        return "KeyedJaggedTensor layout (key-major)"

    def run(self, data, xp) -> dict[str, Any]:
        values, lengths = [], []
        for name in ("categorical_ids", "bucketized"):
            if name in data:
                values.append(data[name].ravel())
                lengths.append(xp.ones(data[name].size, dtype=np.int32))
        for jagged in data.get("multi_hot_ids", ()):
            values.append(jagged.values)
            lengths.append(jagged.lengths)
        lengths = xp.concatenate(lengths)
        offsets = xp.zeros(lengths.size + 1, dtype=np.int64)
        xp.cumsum(lengths, dtype=np.int64, out=offsets[1:])
        return {"sparse": ops.Jagged(xp.concatenate(values), lengths, offsets)}


_MEMO_LOW, _MEMO_HIGH = -1024, 1 << 16


@functools.lru_cache(maxsize=64)
def _normalize_table(fill: float, clip: float | None, log: bool) -> tuple[np.ndarray, np.float32]:
    table = ops.normalize_dense(np.arange(_MEMO_LOW, _MEMO_HIGH, dtype=np.float32), fill, clip, log)
    return table, ops.normalize_dense(np.full(1, np.nan, dtype=np.float32), fill, clip, log)[0]


def normalize_dense_memo(x: np.ndarray, fill: float, clip: float | None, log: bool) -> np.ndarray:
    """``ops.normalize_dense`` on the CPU, bit for bit: an elementwise function, so its values at the small
    integers (most counts) and at NaN (missing) are computed once and looked up; other values are computed."""
    table, at_nan = _normalize_table(fill, clip, log)
    with np.errstate(invalid="ignore"):
        small = (x >= _MEMO_LOW) & (x < _MEMO_HIGH)
    whole = np.where(small, x, 0).astype(np.int64)
    out = table[whole - _MEMO_LOW]
    other = ~(small & (whole == x)) | (x.view(np.uint32) == np.uint32(0x80000000))  # -0.0 keeps its sign
    if other.any():
        nan = np.isnan(x)
        out[nan] = at_nan
        other &= ~nan
        if other.any():
            out[other] = ops.normalize_dense(x[other], fill, clip, log)
    return out
