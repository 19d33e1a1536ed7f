"""The stages of a tabular feature pipeline, each with one implementation that runs on NumPy (CPU) or CuPy
(GPU): ``run(data, xp, out)`` takes the batch's arrays so far and returns the ones it produces.

Arrays are feature-major (``[features, rows]``) until ``dense`` writes its output row-major ``[rows, features]``.
Each stage works on the whole batch in a few native passes (``feedline.ops``: numba kernels that release the
GIL on the CPU, one CUDA kernel each on the GPU). A stage declares the arrays it produces with a fixed shape
(``shapes(rows)``) so that the runner can hand them in preallocated (``out``): the buffers a batch is delivered
in, the pinned buffer that crosses to the GPU, or scratch reused by a thread; a stage given none allocates.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .. import ops
from .stage import BOTH, CPU_ONLY, Stage

MISSING_ID = -1
SHAPES_KEPT = 8  # batch sizes whose shapes a stage keeps (``shapes_of``)
Shapes = dict[str, tuple[tuple[int, ...], np.dtype]]
# How an output lies in a row block (``ops.RowLayout``: a row's finished values as 32-bit words, for a batch to
# gather): ROW_VALUE float32 [B]; ROW_VALUES float32 [B, D]; ROW_IDS int64 [K, B] holding ids below 2**32.
ROW_VALUE, ROW_VALUES, ROW_IDS = "value", "values", "ids"


def _array(out: Mapping[str, Any] | None, name: str, shape: tuple[int, ...], dtype, xp):
    """The array the runner preallocated for ``name``, or a new one."""
    if out is not None and name in out:
        return out[name]
    return xp.empty(shape, dtype=dtype)


def _arrays(out: Mapping[str, Any] | None, shapes: Shapes, xp) -> dict[str, Any]:
    """The arrays of ``shapes``: the runner's preallocated ones where ``out`` has them all (a batch's usual case:
    one look-up each, in C: no comprehension's frame), else each as ``_array`` gives it."""
    if out is not None:
        try:
            return dict(zip(shapes, map(out.__getitem__, shapes)))
        except KeyError:
            pass
    return {name: _array(out, name, shape, dtype, xp) for name, (shape, dtype) in shapes.items()}


@dataclass(frozen=True)
class FeatureStage(Stage):
    consumes: tuple[str, ...]
    produces: tuple[str, ...]
    backends = BOTH

    def shapes(self, rows: int) -> Shapes:
        """Shape and dtype of each produced array whose shape a batch of ``rows`` rows fixes."""
        return {}

    def shapes_of(self, rows: int) -> Shapes:
        """``shapes(rows)``, made once per batch size (a batch then builds no dict of shapes; do not change it).
        Only the first few sizes are kept: runs of a table's chunks come in as many sizes as it has chunks."""
        made = self._shapes_made.get(rows)
        if made is None:
            made = self.shapes(rows)
            if len(self._shapes_made) < SHAPES_KEPT:
                self._shapes_made[rows] = made
        return made

    @functools.cached_property
    def _shapes_made(self) -> dict[int, Shapes]:
        return {}

    def run(self, data: Mapping[str, Any], xp, out: Mapping[str, Any] | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def constants(self, rows: int) -> dict[str, np.ndarray]:
        """Outputs that are the same in every batch of ``rows`` rows, made once (NumPy): the runner may hand every
        such batch these very arrays (given in ``out`` with ``out["constant"]`` True, the stage then leaves them
        as they are)."""
        return {}

    def row_forms(self) -> dict[str, str] | None:
        """None where a row of an output may depend on other rows of the batch; else each output a row block can
        hold, with its form (``ROW_VALUE``, ``ROW_VALUES``, ``ROW_IDS``): such a stage may run over a table's
        rows once as they are read, its outputs kept per row, instead of over every batch."""
        return None

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class Parse(FeatureStage):
    """The rows the source read -> ``label`` float32 [B], ``dense_raw`` float32 [D, B] (NaN = missing),
    ``categorical_raw`` int64 [K, B] (missing = ``MISSING_ID``), ``lists_raw`` (one list column per multi-hot
    feature). CPU only: it reads the source."""

    label: str | None
    dense: tuple[str, ...]
    categorical: tuple[str, ...]
    lists: tuple[str, ...]
    name = "parse"
    backends = CPU_ONLY

    def describe(self) -> str:
        return "read the rows' columns: label, dense, ids, lists"

    def shapes(self, rows: int) -> Shapes:
        shapes: Shapes = {}
        if self.label is not None:
            shapes["label"] = ((rows,), np.dtype(np.float32))
        if self.dense:
            shapes["dense_raw"] = ((len(self.dense), rows), np.dtype(np.float32))
        if self.categorical:
            shapes["categorical_raw"] = ((len(self.categorical), rows), np.dtype(np.int64))
        return shapes

    def row_forms(self) -> dict[str, str]:
        return {"label": ROW_VALUE} if self.label is not None else {}

    def read_chunk(self, source, chunk, start: int, stop: int, out: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Rows ``start..stop`` of one chunk of a streamed table (``source.load_raw``), in order, as :meth:`read`
        gives rows (list columns aside)."""
        arrays = _arrays(out, self.shapes_of(stop - start), np)
        source.gather_chunk(chunk, start, stop, label=self.label, dense=self.dense, categorical=self.categorical,
                            missing_id=MISSING_ID, label_out=arrays.get("label"), dense_out=arrays.get("dense_raw"),
                            ids_out=arrays.get("categorical_raw"))
        return arrays

    def read(self, source, rows: np.ndarray, out: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], np.ndarray]:
        """Rows ``rows`` of ``source`` parsed, and which of them are bad. A source that gathers (a streamed
        table) writes them straight from its cached chunks into the arrays; any other goes through its
        ``read`` and :meth:`run`."""
        rows_n = rows.size  # (the shapes kept for this size looked up here: no call)
        arrays = _arrays(out, self._shapes_made.get(rows_n) or self.shapes_of(rows_n), np)
        if not hasattr(source, "gather"):
            read = source.read(rows)
            return self.run({"columns": read.columns}, np, arrays), read.bad
        got = source.gather(rows, label=self.label, dense=self.dense, categorical=self.categorical, lists=self.lists,
                            missing_id=MISSING_ID, label_out=arrays.get("label"), dense_out=arrays.get("dense_raw"),
                            ids_out=arrays.get("categorical_raw"))
        if self.lists:
            arrays["lists_raw"] = tuple(got.lists[name] for name in self.lists)
        return arrays, got.bad

    def run(self, data, xp=np, out=None) -> dict[str, Any]:
        """From ``data["columns"]`` (name -> values and missing mask, as a source's ``read`` gives them)."""
        columns = data["columns"]
        rows = len(next(iter(columns.values())).values) if columns else 0
        arrays = {name: _array(out, name, shape, dtype, np) for name, (shape, dtype) in self.shapes(rows).items()}
        if self.label is not None:
            arrays["label"][:] = columns[self.label].values
        for name, row in zip(self.dense, arrays.get("dense_raw", ())):
            row[:] = columns[name].values
            row[columns[name].missing] = np.nan
        for name, row in zip(self.categorical, arrays.get("categorical_raw", ())):
            row[:] = columns[name].values
            row[columns[name].missing] = MISSING_ID
        if self.lists:
            arrays["lists_raw"] = tuple(columns[name] for name in self.lists)
        return arrays


@dataclass(frozen=True)
class DenseColumns(FeatureStage):
    """``dense_raw`` -> ``dense`` float32 [B, D] (fill, clip, log1p per column: ``ops.normalize_columns``) and
    ``bucketized`` int64 [K, B] for the columns with boundaries (the same steps, then ``ops.bucketize``)."""

    dense: tuple  # Dense declarations without boundaries, in output order: rows 0.. of dense_raw
    bucketized: tuple  # Dense declarations with boundaries: the rows of dense_raw after them
    name = "dense"

    def describe(self) -> str:
        return "fill, clip, log1p; bucketize"

    def row_forms(self) -> dict[str, str]:
        return {"dense": ROW_VALUES, "bucketized": ROW_IDS}  # (bucket numbers: below 2**32)

    @functools.cached_property
    def normalize_settings(self) -> ops.DensePlan:
        """Each dense column's fill, clip and log1p, as ``ops.normalize_columns`` takes them."""
        return ops.dense_plan(range(len(self.dense)), [f.fill for f in self.dense],
                              [f.clip_min for f in self.dense], [f.log1p for f in self.dense])

    @functools.cached_property
    def bucketize_settings(self) -> ops.DensePlan:
        """The bucketized columns' fill, clip and log1p (rows after the dense ones), as ``ops.normalize_columns``
        takes them."""
        first = len(self.dense)
        return ops.dense_plan(range(first, first + len(self.bucketized)), [f.fill for f in self.bucketized],
                              [f.clip_min for f in self.bucketized], [f.log1p for f in self.bucketized])

    def shapes(self, rows: int) -> Shapes:
        shapes: Shapes = {}
        if self.dense:
            shapes["dense"] = ((rows, len(self.dense)), np.dtype(np.float32))
        if self.bucketized:
            shapes["bucketized"] = ((len(self.bucketized), rows), np.dtype(np.int64))
        return shapes

    def run(self, data, xp, out=None) -> dict[str, Any]:
        raw = data["dense_raw"]
        result: dict[str, Any] = {}
        if self.dense:  # (the runner's array, else one made: ``_array``'s, without its call)
            out_dense = None if out is None else out.get("dense")
            if out_dense is None:
                out_dense = xp.empty((raw.shape[1], len(self.dense)), dtype=np.float32)
            result["dense"] = ops.normalize_columns(raw, self.normalize_settings, out_dense)
        if self.bucketized:
            ids = _array(out, "bucketized", (len(self.bucketized), raw.shape[1]), np.int64, xp)
            values = ops.normalize_columns(raw, self.bucketize_settings)  # [B, K]: normalize_dense's bits, one pass
            for k, f in enumerate(self.bucketized):
                ids[k] = ops.bucketize(values[:, k], xp.asarray(f.boundaries, dtype=np.float64))
            result["bucketized"] = ids
        return result


@dataclass(frozen=True)
class HashColumns(FeatureStage):
    """``categorical_raw`` -> ``categorical_ids`` int64 [C + X, B]: each categorical ``(row, buckets, seed)``
    hashed like ``ops.hash_buckets``, each cross ``(row_a, row_b, buckets, seed)`` like ``ops.cross``, all in
    one pass (``ops.hash_columns``). ``targets``: the output row of each categorical then each cross (None:
    in that order)."""

    categorical: tuple[tuple[int, int, int], ...]
    crosses: tuple[tuple[int, int, int, int], ...]
    targets: tuple[int, ...] | None = None
    name = "hash"

    def describe(self) -> str:
        return "MurmurHash3 ids and crosses to buckets"

    def row_forms(self) -> dict[str, str]:
        return {"categorical_ids": ROW_IDS}  # (bucket ids: below 2**32)

    @functools.cached_property
    def hash_settings(self) -> tuple[ops.HashPlan, ops.HashPlan]:
        """The categorical columns' and the crosses' rows, buckets, seeds and output rows, as
        ``ops.hash_columns`` takes them."""
        targets = list(range(len(self.categorical) + len(self.crosses))) if self.targets is None else list(self.targets)
        c = len(self.categorical)
        return (ops.hash_plan([r for r, _, _ in self.categorical], [n for _, n, _ in self.categorical],
                              [s for _, _, s in self.categorical], targets[:c]),
                ops.hash_plan(np.array([(a, b) for a, b, _, _ in self.crosses], dtype=np.int64).reshape(-1, 2),
                              [n for _, _, n, _ in self.crosses], [s for _, _, _, s in self.crosses], targets[c:]))

    @functools.cached_property
    def _plans(self) -> tuple[ops.HashPlan, ...]:
        """The plans of ``hash_settings`` that have keys (made once: a batch asks none for its length)."""
        return tuple(settings for settings in self.hash_settings if len(settings))

    def shapes(self, rows: int) -> Shapes:
        return {"categorical_ids": ((len(self.categorical) + len(self.crosses), rows), np.dtype(np.int64))}

    def run(self, data, xp, out=None) -> dict[str, Any]:
        raw = data["categorical_raw"]
        ids = None if out is None else out.get("categorical_ids")  # (``_array``'s, without its call)
        if ids is None:
            ids = xp.empty((len(self.categorical) + len(self.crosses), raw.shape[1]), dtype=np.int64)
        for settings in self._plans:
            ops.hash_columns(raw, settings, ids)
        return {"categorical_ids": ids}


@dataclass(frozen=True)
class MultiHotColumns(FeatureStage):
    """``lists_raw`` -> ``multi_hot_ids``: each list column hashed, truncated and jagged (``ops.multi_hot``)."""

    columns: tuple  # MultiHot declarations
    name = "multi_hot"

    def describe(self) -> str:
        return "hash and truncate list columns (jagged)"

    def row_forms(self) -> dict[str, str]:
        return {}  # per row, but jagged: no row block holds it

    def run(self, data, xp, out=None) -> dict[str, Any]:
        return {"multi_hot_ids": tuple(ops.multi_hot(col.offsets, col.values, f.num_buckets, f.seed, f.max_len)
                                       for col, f in zip(data["lists_raw"], self.columns, strict=True))}


@dataclass(frozen=True)
class AssembleSparse(FeatureStage):
    """Every sparse key -> ``sparse`` in TorchRec's key-major ``KeyedJaggedTensor`` layout, keys in ``keys``
    order. ``sources``: where each key's ids are, ``(array, row)``: a row of ``categorical_ids`` or
    ``bucketized`` (one id per row of the batch), or an entry of ``multi_hot_ids`` (jagged).

    Without multi-hot keys every key has one id per row, so ``values`` has a fixed size (``shapes``) and when
    one input holds every key's ids in key order (``alias``), the runner may have that input written straight
    into ``values`` (and says so with ``out["sparse.aliased"]``); nothing is then copied. ``lengths`` and
    ``offsets`` are then the same in every batch of a size (``constants``)."""

    keys: tuple[str, ...]
    sources: tuple[tuple[str, int], ...]
    name = "assemble"

    def describe(self) -> str:
        return "KeyedJaggedTensor layout (key-major)"

    @functools.cached_property
    def fixed(self) -> bool:
        return all(name != "multi_hot_ids" for name, _ in self.sources)

    @functools.cached_property
    def alias(self) -> str | None:
        """The input whose rows are the keys' ids in key order, if one is (it can then be ``values`` itself)."""
        names = {name for name, _ in self.sources}
        if len(names) == 1 and self.fixed and [row for _, row in self.sources] == list(range(len(self.sources))):
            return names.pop()
        return None

    def shapes(self, rows: int) -> Shapes:
        if not self.fixed:
            return {}
        n = len(self.keys) * rows
        return {"sparse.values": ((n,), np.dtype(np.int64)), "sparse.lengths": ((n,), np.dtype(np.int32)),
                "sparse.offsets": ((n + 1,), np.dtype(np.int64))}

    def constants(self, rows: int) -> dict[str, np.ndarray]:
        """With one id per key and row: ``lengths`` (all 1) and ``offsets`` (0..n), as TorchRec's own Criteo loader
        shares them between its batches."""
        if not self.fixed:
            return {}
        n = len(self.keys) * rows
        lengths, offsets = np.empty(n, dtype=np.int32), np.empty(n + 1, dtype=np.int64)
        ops.one_per_row(lengths, offsets)
        return {"sparse.lengths": lengths, "sparse.offsets": offsets}

    def run(self, data, xp, out=None) -> dict[str, Any]:
        if not self.fixed:
            return {"sparse": self._jagged(data, xp)}
        name, row = self.sources[0]
        rows = data[name].shape[1]
        try:  # (the runner's arrays, as a batch has them: three look-ups, no call)
            values, lengths, offsets = out["sparse.values"], out["sparse.lengths"], out["sparse.offsets"]
        except (KeyError, TypeError):  # (some, or no ``out``)
            arrays = _arrays(out, self.shapes_of(rows), xp)
            values, lengths, offsets = arrays["sparse.values"], arrays["sparse.lengths"], arrays["sparse.offsets"]
        written = out is not None and out.get("sparse.aliased") == self.alias and data[self.alias] is out[self.alias]
        if not written:  # (the runner had the ids written into values' memory, and they were)
            by_key = values.reshape(len(self.keys), rows)
            for k, (name, row) in enumerate(self.sources):
                by_key[k] = data[name][row]
        if not (out is not None and out.get("constant") and out.get("sparse.lengths") is lengths):
            ops.one_per_row(lengths, offsets)
            return {"sparse": ops.Jagged(values, lengths, offsets)}
        # (lengths and offsets: this stage's own constants, checked when made; values: the runner's buffer for it)
        return {"sparse": ops.Jagged.of_checked(values, lengths, offsets)}

    def _jagged(self, data, xp) -> ops.Jagged:
        values, lengths = [], []
        for name, row in self.sources:
            if name == "multi_hot_ids":
                jagged = data[name][row]
                values.append(jagged.values)
                lengths.append(jagged.lengths)
            else:
                values.append(data[name][row])
                lengths.append(xp.ones(data[name].shape[1], dtype=np.int32))
        lengths = xp.concatenate(lengths)
        offsets = xp.zeros(lengths.size + 1, dtype=np.int64)
        xp.cumsum(lengths, dtype=np.int64, out=offsets[1:])
        return ops.Jagged(xp.concatenate(values), lengths, offsets)
