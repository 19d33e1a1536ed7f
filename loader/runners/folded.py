"""The CPU stages of a feature pipeline that work row by row (parse, then dense and hash: each output row depends
on its input row alone), run over a streamed table's chunks as they are read instead of over every batch.

Each chunk's rows go through the stages once, in order, a run of rows at a time, and are kept finished as a row
block (``PreparedRows``); a batch then gathers its rows' finished values straight into its arrays, in one pass.
The values are those the stages give a batch: the same stages run, on the same rows. The stages keep their
meaning: what a chunk's preparation costs in each stage is charged to that stage when the runner profiles.

Folding needs a table that keeps prepared rows (``prepared_rows``), stages whose outputs that the rest of the
pipeline (later CPU stages, GPU stages, outputs) needs can all be held in a row block (``row_forms``): a
placement that sends raw columns to the GPU folds nothing; and a table whose cached rows are wider than
finished ones (parsed text and Parquet are; a converted table's records are not, and are gathered as they are).
"""
from __future__ import annotations

import math
import threading
from typing import Any, Mapping

import numpy as np

from ... import ops
from ...ops._native import kernels
from ...ops.normalize_columns import _log1p_table
from ...pipelines.features import MISSING_ID, ROW_IDS, ROW_VALUE, ROW_VALUES, DenseColumns, HashColumns, Parse
from ..sources.chunked import ChunkedTable

RUN_ROWS = 8192  # rows of a chunk prepared at a time (their arrays stay in the core's caches)
SIZES_KEPT = 1024  # run sizes whose scratch views a thread keeps (then it starts again)


class Folded:
    """``stages`` (after ``parse``) folded into reading: the arrays ``names`` (label, dense, ids, more: each an
    array name or None) are what a batch gathers, as ``layout`` lays them out."""

    def __init__(self, parse: Parse, stages: tuple, names: tuple, layout: ops.RowLayout):
        self.parse = parse
        self.stages = stages
        self.names = names
        self.layout = layout
        self.stage_names = (parse.name,) + tuple(stage.name for stage in stages)
        self._local = threading.local()
        self._direct = _Direct.of(parse, stages, names, layout)

    @classmethod
    def plan(cls, spec, cut: int, source) -> Folded | None:
        """The longest run of row-by-row CPU stages from the first, folded, when the table keeps prepared rows
        and a row block holds every output of the run that the rest of the pipeline needs; else None."""
        parse = spec.stages[0]
        if not isinstance(parse, Parse) or not hasattr(source, "prepared_rows"):
            return None
        forms: dict[str, str] = {}
        run = []
        for stage in spec.stages[:cut]:
            stage_forms = stage.row_forms()
            if stage_forms is None:
                break
            run.append(stage)
            forms.update(stage_forms)
        rest = spec.stages[len(run):]
        produced = {name for stage in run for name in stage.produces}
        needed = produced & set(spec.outputs).union(*(stage.consumes for stage in rest))
        if len(run) < 2 or not needed or any(name not in forms for name in needed):
            return None
        by_form = {form: sorted(name for name in needed if forms[name] == form)
                   for form in (ROW_VALUE, ROW_VALUES, ROW_IDS)}
        if len(by_form[ROW_VALUE]) > 1 or len(by_form[ROW_VALUES]) > 1 or len(by_form[ROW_IDS]) > 2:
            return None
        shapes: dict = {}
        for stage in run:
            shapes.update(stage.shapes(1))
        label = by_form[ROW_VALUE][0] if by_form[ROW_VALUE] else None
        dense = by_form[ROW_VALUES][0] if by_form[ROW_VALUES] else None
        ids = by_form[ROW_IDS] + [None] * (2 - len(by_form[ROW_IDS]))
        if any(name is not None and name not in shapes for name in (label, dense, *ids)):
            return None
        layout = ops.RowLayout(label=int(label is not None), dense=shapes[dense][0][1] if dense else 0,
                               ids=shapes[ids[0]][0][0] if ids[0] else 0, more=shapes[ids[1]][0][0] if ids[1] else 0)
        # Preparing costs passes of its own over every row; they pay where a finished row is narrower than a
        # cached raw one (parsed text: 9 bytes a value), not over a converted table's narrow records.
        if 4 * layout.width >= getattr(source, "cached_row_bytes", 0.0):
            return None
        return cls(parse, tuple(run[1:]), (label, dense, ids[0], ids[1]), layout)

    def rows_of(self, source):
        """The source's prepared rows for these stages (shared with every runner folding the same ones)."""
        return source.prepared_rows((self.layout, self.parse, self.stages), self.layout,
                                    lambda raw, block, clock: self._prepare(source, raw, block, clock), read_stage=self.parse.name)

    def read(self, prepared, rows: np.ndarray, out: Mapping[str, Any], *, charge: bool = False):
        """The batch of ``rows``: (its arrays, written into ``out``'s; bad rows; seconds charged per stage; thread
        seconds spent preparing chunks)."""
        arrays = {name: out[name] for name in self.names if name is not None}
        label, dense, ids, more = (None if name is None else arrays[name] for name in self.names)
        got = prepared.gather(rows, label=label, dense=dense, ids=ids, more=more, charge=charge)
        return arrays, got.bad, got.charged, got.spent

    # ---- preparing a chunk (on whichever thread reads it first) ---------------------------------------------
    def _prepare(self, source, raw, block: np.ndarray, clock) -> dict[str, float]:
        """Every row of the chunk ``raw`` through the stages into ``block``; seconds per stage by ``clock``."""
        seconds = dict.fromkeys(self.stage_names, 0.0)
        parse = self.parse.name
        rows = block.shape[0]
        direct = self._direct
        if direct is not None and type(source).gather_chunk is ChunkedTable.gather_chunk:
            picks = source.picks(self.parse.label, self.parse.dense, self.parse.categorical)
            for start in range(0, rows, RUN_ROWS):
                stop = min(rows, start + RUN_ROWS)
                direct.run(raw.block, picks, block, start, stop, self._scratch(stop - start), clock, seconds)
            return seconds
        for start in range(0, rows, RUN_ROWS):
            stop = min(rows, start + RUN_ROWS)
            out = self._scratch(stop - start)
            began = clock()
            data = self.parse.read_chunk(source, raw, start, stop, out)
            took = clock()
            seconds[parse] += took - began
            for stage in self.stages:
                data.update(stage.run(data, np, out))
                began, took = took, clock()
                seconds[stage.name] += took - began
            label, dense, ids, more = map(data.get, self.names)  # (no None key: None where a name is)
            ops.pack_rows(block, start, self.layout, label=label, dense=dense, ids=ids, more=more)
            seconds[parse] += clock() - took
        return seconds

    def _scratch(self, rows: int) -> dict[str, np.ndarray]:
        """This thread's arrays for a run of ``rows`` rows (views of buffers kept for ``RUN_ROWS`` rows), made once
        for each run size (a table's chunks come in a few hundred sizes at most; each chunk asked for them, ~4 us)."""
        local = self._local
        views = getattr(local, "views", None)
        if views is None:
            buffers = local.buffers = {}
            views = local.views = {}
            for stage in (self.parse, *self.stages):
                for name, (shape, dtype) in stage.shapes(RUN_ROWS).items():
                    buffers[name] = np.empty(math.prod(shape), dtype=dtype)
        out = views.get(rows)
        if out is None:
            if len(views) >= SIZES_KEPT:
                views.clear()
            buffers = local.buffers
            out = views[rows] = {}
            for stage in (self.parse, *self.stages):  # (math.prod: one call, where np.prod is five in Python)
                for name, (shape, _) in stage.shapes(rows).items():
                    out[name] = buffers[name][:math.prod(shape)].reshape(shape)
        return out


class _Direct:
    """Parse (from a table's chunk block), dense (fill, clip, log1p; no buckets) and hash, then the packing, as
    their numba kernels, called straight from a run's scratch: the values ``Parse.read_chunk``,
    ``DenseColumns.run``, ``HashColumns.run`` and ``ops.pack_rows`` give (the same kernels on the same arrays,
    in the same order), without their Python wrappers and checks, whose shapes the scratch fixes. Each was a
    few steps holding the GIL, run with the caches cold after a chunk's parse (~15 Python calls a chunk)."""

    def __init__(self, natives: tuple, parse: Parse, dense: DenseColumns, hashes: HashColumns, layout: ops.RowLayout):
        self.gather, self.normalize, self.murmur3, self.rows = natives
        plan = dense.normalize_settings
        self.dense = (plan.sources, plan.fill, plan.clip_min, plan.log, _log1p_table(self.normalize))
        self.hashes = tuple((True, plan.flat_sources, None, plan.num_buckets, plan.seeds, plan.targets)
                            if plan.sources.shape[1] == 1 else
                            (False, np.ascontiguousarray(plan.sources[:, 0]), np.ascontiguousarray(plan.sources[:, 1]),
                             plan.num_buckets, plan.seeds, plan.targets) for plan in hashes._plans)
        self.names = (parse.name, dense.name, hashes.name)
        self.layout = layout
        self.steps = np.arange(RUN_ROWS, dtype=np.int64)  # (grown for a chunk of more rows; never written)

    @classmethod
    def of(cls, parse: Parse, stages: tuple, names: tuple, layout: ops.RowLayout) -> _Direct | None:
        """Where the folded stages are just these (as ``Folded.plan`` names their outputs) and the kernels are
        there; else None (the stages run as they are)."""
        if len(stages) != 2 or type(stages[0]) is not DenseColumns or type(stages[1]) is not HashColumns:
            return None
        dense, hashes = stages
        if parse.label is None or not parse.dense or not parse.categorical or parse.lists or not dense.dense \
                or dense.bucketized or names != ("label", "dense", "categorical_ids", None) \
                or dense.consumes != ("dense_raw",) or hashes.consumes != ("categorical_raw",):
            return None
        natives = tuple(kernels(name) for name in ("gather", "normalize", "murmur3", "rows"))
        return None if None in natives else cls(natives, parse, dense, hashes, layout)

    def run(self, chunk: ops.ColumnBlock, picks: np.ndarray, block: np.ndarray, start: int, stop: int,
            out: dict, clock, seconds: dict) -> None:
        """Rows ``start..stop`` of the chunk's ``block`` through the kernels into rows ``start..`` of ``block``."""
        steps = self.steps
        if steps.size < stop:
            steps = self.steps = np.arange(stop, dtype=np.int64)
        label, raw, ids_raw, dense, ids = (out["label"], out["dense_raw"], out["categorical_raw"], out["dense"],
                                           out["categorical_ids"])
        began = clock()
        self.gather.gather_columns(chunk.data, chunk.flags, chunk.layout, picks, steps[start:stop],
                                   steps[:stop - start], np.int64(MISSING_ID), label, raw, ids_raw)
        took = clock()
        parse, dense_name, hash_name = self.names
        seconds[parse] += took - began
        self.normalize.normalize_columns(raw, *self.dense, dense)
        began, took = took, clock()
        seconds[dense_name] += took - began
        words = ids_raw.view(np.uint32)
        for single, a, b, buckets, seeds, targets in self.hashes:
            if single:
                self.murmur3.hash_columns(words, a, buckets, seeds, targets, ids)
            else:
                self.murmur3.cross_columns(words, a, b, buckets, seeds, targets, ids)
        began, took = took, clock()
        seconds[hash_name] += took - began
        if self.rows.pack_rows(block, block.view(np.float32), np.int64(start), np.int64(1), label, dense, ids,
                               _NO_IDS) >= 0:
            ops.pack_rows(block, start, self.layout, label=label, dense=dense, ids=ids)  # (raises the error)
        seconds[parse] += clock() - took


_NO_IDS = np.zeros((0, 0), dtype=np.int64)
