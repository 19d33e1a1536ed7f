"""Runs a mix: one runner per source, each with its own stages, placement and read-ahead. The mixed plans' places
are dealt to plans of each source (whole batches of it, gathered over consecutive mixed plans, see ``_Split``),
and every mixed batch is put together from its sources' batches in the plan's order.

The sources' runners run side by side, each on a thread of its own (a ``BackgroundStream``, ``prefetch`` batches
ahead): each pulls its own plans as far ahead as it reads (``_Split`` hands them out, reading the mixed plans as
far as the furthest runner asks), so their work and their waits overlap instead of adding up. Each source
runner makes every plan's batch from that plan alone (``SkipFill.PADDING``), so a source's k-th batch is its
k-th plan's; a sample left out (``on_error="skip"``) leaves its place in the mixed batch invalid. On the CPU
the outputs are copied into place (a batch's bytes once more: 16 ms for 64 float32 224x224 images on 2 busy cores).
"""
from __future__ import annotations

import dataclasses
import threading
from collections import deque
from typing import Any, Callable, Iterator

import numpy as np
import torch

from ...pipelines.mix import MixSpec
from ..background import BackgroundStream
from ..sampler import BatchPlan
from ..sources.mixed import MixedSources, MixPlan, part_seed
from .buffers import BufferRing
from .contract import NO_TIMER, BatchInfo, RunnerConfig, SkipFill, StageTimer, StageTimes


class _Piece:
    """A mixed plan's places drawn from one source (and one of its own epochs), and, once the source plan that
    holds them is made, which one it is (``sub``, counted per source) and their rows in it."""

    __slots__ = ("source", "places", "local", "valid", "sub", "start", "stop")

    def __init__(self, source: int, places: np.ndarray, local: np.ndarray, valid: np.ndarray):
        self.source, self.places, self.local, self.valid = source, places, local, valid
        self.sub, self.start, self.stop = None, 0, 0


class _Split:
    """Mixed plans in, one plan stream per source out (thread-safe: a runner may pull from its own threads).

    A source's plan gathers its places from consecutive mixed plans (a mixed plan's places may end one source
    plan and start the next), ``rows`` of them (the batch size), or fewer where ``most`` mixed plans gave them
    or its own epoch changes, so that each source's batches are as large as one source's
    would be: a half-size batch costs an image pipeline nearly a whole one's fixed work."""

    def __init__(self, plans: Iterator[MixPlan], parts: int, rows: int, most: int = 8):
        self._plans = plans
        self._lock = threading.Lock()
        self._rows, self._most = rows, most
        self._queues = [deque() for _ in range(parts)]  # the plans each source's runner takes
        self.issued = [deque() for _ in range(parts)]   # ... and the same for the batch thread, to match rows
        self._open: list[list[_Piece]] = [[] for _ in range(parts)]
        self._epoch = [None] * parts
        self._counted = [0] * parts
        self._made: deque = deque()  # (plan, [_Piece]) in plan order
        self._over = False
        self._numbered = 0

    def _pull(self) -> bool:
        """Split the next mixed plan (called holding the lock); False at the end of the plans."""
        if self._over:
            return False
        plan = next(self._plans, None)
        if plan is None:
            self._over = True
            for source in range(len(self._open)):
                self._close(source)
            return False
        if not isinstance(plan, MixPlan):
            raise TypeError(f"a mix's runner takes MixPlans, which say each sample's source and own epoch; got a "
                            f"{type(plan).__name__} (an order dealing a mix's places makes them with "
                            f"MixOrder.make_plan)")
        pieces = []
        key = plan.sources * (int(plan.source_epochs.max()) + 1) + plan.source_epochs
        for k in np.unique(key).tolist():
            places = np.flatnonzero(key == k)
            source, epoch = int(plan.sources[places[0]]), int(plan.source_epochs[places[0]])
            if self._epoch[source] != epoch:
                self._close(source)
                self._epoch[source] = epoch
            while places.size:  # (a runner's batch holds no more than the batch size: the rest starts the next)
                room = self._rows - self._held(source)
                if room == 0:
                    self._close(source)
                    continue
                taken, places = places[:room], places[room:]
                piece = _Piece(source, taken, plan.local[taken], plan.valid[taken])
                self._open[source].append(piece)
                pieces.append(piece)
        for source, held in enumerate(self._open):
            if held and (self._held(source) >= self._rows or len(held) >= self._most):
                self._close(source)
        self._made.append((plan, pieces))
        return True

    def _held(self, source: int) -> int:
        return sum(p.local.size for p in self._open[source])

    def _close(self, source: int) -> None:
        """Make the source's plan of the places it holds."""
        held = self._open[source]
        if not held:
            return
        start = 0
        for piece in held:
            piece.sub, piece.start, piece.stop = self._counted[source], start, start + piece.local.size
            start = piece.stop
        # (numbered in turn: a runner tells one plan's samples from the next by epoch and number)
        sub = BatchPlan(np.concatenate([p.local for p in held]), np.concatenate([p.valid for p in held]),
                        self._epoch[source], 0, False, self._numbered, None)
        self._numbered += 1
        self._counted[source] += 1
        self._queues[source].append(sub)
        self.issued[source].append(sub)
        self._open[source] = []

    def stream(self, source: int) -> Iterator[BatchPlan]:
        queue = self._queues[source]
        while True:
            with self._lock:
                while not queue and self._pull():
                    pass
                if not queue:
                    return
                sub = queue.popleft()
            yield sub

    def next_made(self):
        """The next mixed plan and its pieces, each in a source plan already made."""
        with self._lock:
            while not self._made and self._pull():
                pass
            if not self._made:
                return None
            while any(piece.sub is None for piece in self._made[0][1]) and self._pull():
                pass
            return self._made.popleft()


def _threads(total: int, weight: float) -> int:
    """A source runner's share of the placement's threads (its weight's, at least one): the sources run side by
    side, and each runner's threads beside the others' would oversubscribe the cores."""
    return max(1, round(total * weight))


class MixRunner:
    """The ``Runner`` of a ``MixSpec`` over its ``MixedSources``; ``make(spec, source, config)`` makes each
    source's runner (``make_runner`` with the Loader's skip log). Batches hold ``source`` beside ``index``."""

    def __init__(self, spec: MixSpec, sources: MixedSources, config: RunnerConfig,
                 make: Callable[[Any, Any, RunnerConfig], Any]):
        self.spec = spec
        self.sources = sources
        self.config = config
        self._outputs = BufferRing(capacity=config.prefetch + 3)  # merged batches: queued, being made, with the trainer
        self.runners = [make(part, source, dataclasses.replace(config, cut=spec.cut_for(k, config.cut),
                                                               seed=part_seed(config.seed, k),
                                                               num_threads=_threads(config.num_threads, w),
                                                               skip_fill=SkipFill.PADDING))
                        for k, (part, source, w) in enumerate(zip(spec.parts, sources.parts, spec.weights))]

    @property
    def skipped(self):
        seen, out = set(), []
        for runner in self.runners:
            if id(runner.skipped) not in seen:
                seen.add(id(runner.skipped))
                out.extend(runner.skipped)
        return out

    def batches(self, plans: Iterator[MixPlan], timer: StageTimer = NO_TIMER
                ) -> Iterator[tuple[dict, BatchInfo]]:
        split = _Split(iter(plans), len(self.runners), self.config.batch_size)
        made = [self._made(runner, split.stream(k), f"making a batch of the mix's source {name!r}")
                for k, (runner, name) in enumerate(zip(self.runners, self.spec.names))]
        current: list = [None] * len(self.runners)  # per source: (its plan's number, batch, rows, good)
        counted = [0] * len(self.runners)
        try:
            while (next_plan := split.next_made()) is not None:
                plan, pieces = next_plan
                parts = []
                for piece in pieces:
                    s = piece.source
                    while current[s] is None or current[s][0] < piece.sub:
                        batch, _ = next(made[s], (None, None))
                        if batch is None:
                            raise RuntimeError("a mix's source runner ended before the mix's plans did")
                        rows, good = _rows_of(batch, split.issued[s].popleft().indices)
                        current[s] = (counted[s], batch, rows, good)
                        counted[s] += 1
                    _, batch, rows, good = current[s]
                    parts.append((piece.places, batch, slice(piece.start, piece.stop) if rows is None
                                  else rows[piece.start:piece.stop], None if good is None
                                  else good[piece.start:piece.stop]))
                batch = merge(plan, parts, self.spec.outputs, self._outputs.empty)
                yield batch, BatchInfo(plan.epoch, plan.start + plan.indices.size, plan.last)
        finally:
            for stream in made:
                stream.close()

    def _made(self, runner, plans: Iterator[BatchPlan], where: str) -> Iterator:
        """A source runner's batches: on a thread of its own (``prefetch`` ahead), or, for tables on the CPU, taken
        here, its worker threads making them ahead (a thread more per source, each taking the GIL for every batch
        it hands on, made a Criteo mix's batches wait for them)."""
        device = self.config.device
        if self.spec.kind == "tables" and device.type == "cpu":
            return _noted(runner.batches(plans), where)
        return BackgroundStream(lambda: runner.batches(plans), self.config.prefetch,
                                cuda=device if device.type == "cuda" else None, describe=lambda: where)

    def profile(self, plans: list[MixPlan]) -> StageTimes:
        """Each source's runner profiled on its share of the plans; the first source's stage names carry the
        seconds of every source (summed by position in the stages)."""
        split = _Split(iter(plans), len(self.runners), self.config.batch_size)
        while split.next_made() is not None:
            pass
        shares = [list(split.stream(k)) for k in range(len(self.runners))]
        results = [(runner.profile(share), part) for runner, share, part in zip(self.runners, shares, self.spec.parts)
                   if share]
        samples = sum(r.samples for r, _ in results)
        first = [s.name for s in self.spec.stages]
        seconds = {name: 0.0 for name in first}
        bytes_out = {name: 0.0 for name in first}
        source_bytes = 0.0
        for r, part in results:
            names = [s.name for s in part.stages]
            for k, name in enumerate(names[:len(first)]):
                seconds[first[k]] += r.seconds.get(name, 0.0)
                bytes_out[first[k]] += r.bytes_out.get(name, 0.0) * r.samples / max(samples, 1)
            source_bytes += r.source_bytes_per_sample * r.samples / max(samples, 1)
        together = results[0][0].together if results else {}
        return StageTimes(samples, seconds, bytes_out, source_bytes, together)

    def close(self) -> None:
        for runner in self.runners:
            runner.close()


def _noted(batches: Iterator, where: str) -> Iterator:
    """``batches``, an error from them noted with ``where`` (as a ``BackgroundStream``'s are)."""
    try:
        yield from batches
    except Exception as exc:
        exc.add_note(f"raised while {where}")
        raise
    finally:
        batches.close()


def _rows_of(sub: dict, expected: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Which row of a source's batch holds each of its places: None where they are in order (no sample left
    out); else the rows, and which places hold a sample (a left-out one's row is one of the padding rows)."""
    got = sub["index"].cpu().numpy()
    if got.size == expected.size and np.array_equal(got, expected):
        return None, None
    rows = np.empty(expected.size, dtype=np.int64)
    good = np.zeros(expected.size, dtype=bool)
    pointer, padding = 0, int((got != -1).sum())
    for j, want in enumerate(expected.tolist()):  # (only where a sample was left out)
        if pointer < got.size and got[pointer] == want:
            rows[j], good[j] = pointer, True
            pointer += 1
        else:
            rows[j], padding = min(padding, got.size - 1), padding + 1
    return rows, good


def merge(plan: MixPlan, parts: list, outputs, empty=torch.empty) -> dict:
    """The batch of ``plan`` from its sources' batches: ``parts`` are ``(places, batch, rows, good)``, the rows
    (a slice or an index array) of ``batch`` that fill ``places``, and which of them hold a sample (None: all
    that the batch says are valid). Every output in plan order, ``index`` the mix index, ``source`` the source
    number and ``valid`` where any place is invalid. ``empty(shape, dtype)`` gives the CPU tensors written (a
    ``BufferRing``'s, reused once the trainer lets go of them)."""
    size = plan.indices.size
    valid = plan.valid.copy()
    for places, sub, rows, good in parts:
        if good is not None:
            valid[places] &= good
        elif "valid" in sub:
            valid[places] &= sub["valid"].cpu().numpy()[rows]
    whole = len(parts) == 1 and isinstance(parts[0][2], slice) and parts[0][2] == slice(0, size) \
        and len(parts[0][1]["index"]) == size
    if whole:
        batch = {name: parts[0][1][name] for name in outputs}
    else:
        batch = {name: _merged(name, size, parts, empty) for name in outputs}
    device = batch[outputs[0]].device if isinstance(batch[outputs[0]], torch.Tensor) else torch.device("cpu")
    batch["index"] = torch.from_numpy(plan.indices).to(device)
    batch["source"] = torch.from_numpy(plan.sources).to(device)
    if not valid.all():
        batch["valid"] = torch.from_numpy(valid).to(device)
    return batch


def _merged(name: str, size: int, parts, empty):
    first = parts[0][1][name]
    if isinstance(first, dict):  # a KeyedJaggedTensor layout
        return _merged_jagged(size, [(places, rows, sub[name]) for places, sub, rows, _ in parts], empty)
    if first.device.type == "cpu":  # (NumPy's row copies: torch's index_copy_ is 20x slower on uint8 images here)
        out = empty((size, *first.shape[1:]), first.dtype)
        rows_out = out.numpy()
        for places, sub, rows, _ in parts:
            rows_out[places] = sub[name].numpy()[rows]
        return out
    out = torch.empty((size, *first.shape[1:]), dtype=first.dtype, device=first.device)
    for places, sub, rows, _ in parts:
        value = sub[name]
        value = value[rows] if isinstance(rows, slice) else value.index_select(0, torch.from_numpy(rows).to(value.device))
        out.index_copy_(0, torch.from_numpy(places).to(out.device), value)
    return out


def _as_array(rows) -> np.ndarray:
    return np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows


def _merged_jagged(size: int, pieces, empty=torch.empty) -> dict:
    """Key-major jagged parts (``keys``, ``values``, ``lengths``, ``offsets``) put back in plan order: NumPy on
    the CPU (torch's indexed assignment is many times slower there), torch on a GPU. ``pieces``: ``(places,
    rows, jagged)``, the rows a slice or an index array; ``empty`` as ``merge``'s."""
    first = pieces[0][2]
    keys = list(first["keys"])
    if first["values"].device.type == "cpu":
        if all(bool((jagged["lengths"].numpy() == 1).all()) for _, _, jagged in pieces):  # one id per key and row
            return {"keys": keys, **_ids_in_order(size, len(keys), pieces, empty)}
        parts = [(places, rows, {name: jagged[name].numpy() for name in ("values", "lengths", "offsets")})
                 for places, rows, jagged in pieces]
        merged = _jagged_in_order(np, size, len(keys), parts, lambda a: a)
        return {"keys": keys, **{name: torch.from_numpy(value) for name, value in merged.items()}}
    device = first["values"].device
    return {"keys": keys, **_jagged_in_order(torch, size, len(keys),
                                             [(places, _as_array(rows), jagged) for places, rows, jagged in pieces],
                                             lambda a: torch.from_numpy(a).to(device))}


def _ids_in_order(size: int, k: int, pieces, empty) -> dict:
    """CPU parts of one id per key and row (``(places, rows, jagged)``) laid out key-major over the batch's
    ``size`` places, into a buffer of ``empty``'s. Each key's ids are put in place one row of the key-major array
    at a time, a slice of rows taken as one; the ``lengths`` (all 1) and ``offsets`` (0 to ``k * size``) are a
    source batch's of as many rows, the tensors its runner shares between its batches, where there is one. (A fancy assignment over all keys and fresh ``ones``
    and ``arange`` arrays, their pages faulted in every batch, made a Criteo batch's merge 4.0-5.7 ms, against
    1.1 ms so, on the mix's batch thread, which merges every batch.)"""
    like = pieces[0][2]
    out = empty((k * size,), like["values"].dtype)
    values = out.numpy().reshape(k, size)
    for places, rows, jagged in pieces:
        ids = jagged["values"].numpy().reshape(k, -1)[:, rows]
        for key in range(k):
            values[key, places] = ids[key]
    same = [jagged for _, _, jagged in pieces if jagged["lengths"].shape[0] == k * size]
    if same:
        return {"values": out, "lengths": same[0]["lengths"], "offsets": same[0]["offsets"]}
    return {"values": out, "lengths": torch.ones(k * size, dtype=like["lengths"].dtype),
            "offsets": torch.arange(k * size + 1, dtype=like["offsets"].dtype)}


def _jagged_in_order(xp, size: int, k: int, pieces, index) -> dict:
    """``values``, ``lengths``, ``offsets`` of ``pieces`` (``(places, rows, jagged)``) laid out key-major over
    the batch's ``size`` places; ``xp``: NumPy or torch, ``index``: a NumPy index array as one of ``xp``'s."""
    like = pieces[0][2]
    if xp is torch and all(bool((jagged["lengths"] == 1).all()) for _, _, jagged in pieces):  # (NumPy's: _ids_in_order)
        values = torch.empty((k, size), dtype=like["values"].dtype, device=like["values"].device)
        for places, rows, jagged in pieces:
            n = jagged["lengths"].shape[0] // k
            ids = jagged["values"].reshape(k, n)
            values[:, index(places)] = ids if rows is None else ids[:, index(rows)]
        lengths = torch.ones(k * size, dtype=like["lengths"].dtype, device=values.device)
        offsets = torch.arange(k * size + 1, dtype=like["offsets"].dtype, device=values.device)
        return {"values": values.reshape(-1), "lengths": lengths, "offsets": offsets}
    lengths_by_key, starts, values, base = None, None, [], 0
    for places, rows, jagged in pieces:
        n = jagged["lengths"].shape[0] // k
        lengths = jagged["lengths"].reshape(k, n)
        begins = jagged["offsets"][:-1].reshape(k, n) + base
        if rows is not None:
            lengths, begins = lengths[:, index(rows)], begins[:, index(rows)]
        if lengths_by_key is None:
            lengths_by_key = xp.zeros((k, size), dtype=lengths.dtype) if xp is np else \
                torch.zeros((k, size), dtype=lengths.dtype, device=lengths.device)
            starts = xp.zeros((k, size), dtype=begins.dtype) if xp is np else \
                torch.zeros((k, size), dtype=begins.dtype, device=begins.device)
        lengths_by_key[:, index(places)] = lengths
        starts[:, index(places)] = begins
        values.append(jagged["values"])
        base += jagged["values"].shape[0]
    flat = lengths_by_key.reshape(-1)
    if xp is np:
        offsets = np.zeros(flat.size + 1, dtype=like["offsets"].dtype)
        np.cumsum(flat, out=offsets[1:])
        total = int(offsets[-1])
        gather = np.repeat(starts.reshape(-1) - offsets[:-1], flat) + np.arange(total)
        return {"values": np.concatenate(values)[gather], "lengths": flat, "offsets": offsets}
    wide = flat.to(torch.int64)
    offsets = torch.zeros(wide.numel() + 1, dtype=torch.int64, device=flat.device)
    torch.cumsum(wide, 0, out=offsets[1:])
    total = int(offsets[-1])
    gather = torch.repeat_interleave(starts.reshape(-1) - offsets[:-1], wide, output_size=total) \
        + torch.arange(total, device=flat.device)
    return {"values": torch.cat(values)[gather], "lengths": flat, "offsets": offsets.to(like["offsets"].dtype)}
