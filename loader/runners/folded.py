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
from ...pipelines.features import ROW_IDS, ROW_VALUE, ROW_VALUES, Parse

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
