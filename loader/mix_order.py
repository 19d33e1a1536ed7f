"""The order of a mix: which source fills each place of an epoch, and which of its samples.

An epoch of a mix is a sequence of places cut into *segments*: one from the epoch's start with the weights in
force, and one more from each ``set_weights`` within the epoch (at the global place the next batch starts).
A segment is cut into windows of ``window`` places, counted from the segment's start; every window holds each
source ``counts[s]`` times (the largest-remainder rounding of ``weight * window``, so within one sample of its
share), in a seeded random order (keyed by seed, epoch, segment start and window) or, without shuffling, in
smooth weighted round-robin order. Each source keeps its own stream: its own order (a seeded permutation, or a
one-rank ``StreamOrder`` for a table) epoch after epoch of its own, its samples taken in that stream's order and
carried over from one mixed epoch to the next, so every source delivers each of its samples once per its own
epoch. The k-th place of source s in the mix takes the next sample of its stream, so a place's sample follows
from counting, with no replay: the epoch's places are a pure function of (seed, epoch, the weights schedule),
and a rank takes every ``world_size``-th place, as ``EpochSampler`` does.

A mixed epoch ends as ``MixEnd`` says. A sample's index in the mix is its source's offset plus its index there;
a plan (``MixPlan``) also carries each sample's source and the source's own epoch (which keys augmentation).
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping

import numpy as np

from ..pipelines.mix import MixEnd, MixSpec, normalised_weights, window_counts
from .sampler import EpochSampler, LastBatch, Order
from .sources.chunked import ChunkedTable
from .sources.mixed import MixedSources, MixPlan, part_seed
from .stream_order import StreamOrder

KEPT = 8  # windows (and per source, own epochs) whose computed order is kept for the batches that follow


class _PartStream:
    """One source's samples as an endless stream: own epoch after own epoch of its own order."""

    def __init__(self, source, seed: int, shuffle: bool, buffer_rows: int | None):
        self.size = len(source)
        if isinstance(source, ChunkedTable):
            kwargs = {} if buffer_rows is None else {"buffer_rows": buffer_rows}
            self.table = StreamOrder(source.chunk_rows, source.chunk_groups, 1, shuffle=shuffle, seed=seed, **kwargs)
        else:
            self.table = None
            self.sampler = EpochSampler(self.size, self.size, shuffle=shuffle, seed=seed)
        self._orders: dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        order = self._orders.get(epoch)
        if order is None:
            order = self.sampler.epoch(epoch)[0].indices
            if len(self._orders) >= 2:
                self._orders.pop(next(iter(self._orders)))
            self._orders[epoch] = order
        return order

    def rows(self, taken: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The samples at stream places ``taken`` (ascending): their indices in the source and own epochs."""
        epochs = taken // self.size
        places = taken - epochs * self.size
        out = np.empty(taken.size, dtype=np.int64)
        for e in range(int(epochs[0]), int(epochs[-1]) + 1) if taken.size else ():
            mask = epochs == e
            at = places[mask]
            if not at.size:  # (an own epoch skipped: a padded batch's repeated first places lie epochs back)
                continue
            if self.table is None:
                out[mask] = self._order(e)[at]
            else:
                lo, hi = int(at.min()), int(at.max()) + 1
                rows, _ = self.table.positions(e, lo, hi)
                out[mask] = rows[at - lo]
        return out, epochs


class Windows:
    """Which source fills each place of a mixed epoch: the weights schedule (``(epoch, place, weights)``, the
    first at epoch 0, place 0), its segments and their windows, and counting places per source."""

    def __init__(self, names: tuple[str, ...], weights: tuple[float, ...], window: int, seed: int, shuffle: bool):
        self.names, self.window, self.seed, self.shuffle = names, window, seed, shuffle
        self.schedule: list[tuple[int, int, tuple[float, ...]]] = [(0, 0, tuple(weights))]
        self._kept: dict = {}

    def change(self, epoch: int, place: int, weights: tuple[float, ...]) -> None:
        """``weights`` from global ``place`` of ``epoch`` on (changes at or after it are dropped)."""
        kept = [s for s in self.schedule if (s[0], s[1]) < (epoch, place)]
        if not kept or kept[-1][2] != weights:
            kept.append((epoch, place, weights))
        self.schedule = kept

    def state(self) -> dict[str, Any]:
        return {"names": list(self.names), "schedule": [[e, p, list(w)] for e, p, w in self.schedule]}

    def load(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or list(state.get("names", [])) != list(self.names):
            raise ValueError(f"state's mix is not over the sources {list(self.names)}: "
                             f"{state.get('names') if isinstance(state, Mapping) else state!r}")
        schedule = []
        try:
            for e, p, w in state["schedule"]:
                normal = normalised_weights(self.names, dict(zip(self.names, w)), self.window, "state's weights")
                if not (isinstance(e, int) and isinstance(p, int) and e >= 0 and p >= 0):
                    raise ValueError(f"state's mix schedule has an invalid place: epoch {e!r}, place {p!r}")
                schedule.append((e, p, normal))
        except (KeyError, TypeError):
            raise ValueError("state has an invalid mix schedule") from None
        if not schedule or schedule[0][:2] != (0, 0) or sorted(schedule, key=lambda s: s[:2]) != schedule:
            raise ValueError("state's mix schedule must start at epoch 0, place 0, in order")
        self.schedule = schedule

    def forget(self) -> None:
        """Drop the windows kept (the schedule changed)."""
        self._kept = {}

    def segments(self, epoch: int) -> list[tuple[int, tuple[int, ...]]]:
        """``(start place, counts per window)`` of each segment of ``epoch``."""
        before = [s for s in self.schedule if (s[0], s[1]) <= (epoch, 0)]
        segments = [(0, window_counts(before[-1][2], self.window))]
        for e, p, w in self.schedule:
            if e == epoch and p > 0:
                segments.append((p, window_counts(w, self.window)))
        return segments

    def slots(self, epoch: int, start: int, window: int, counts: tuple[int, ...]):
        """Which source fills each place of a window, and how many of that source's places come before it in
        the window."""
        key = (epoch, start, window, counts)
        kept = self._kept.get(key)
        if kept is not None:
            return kept
        if self.shuffle:
            base = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
            rng = np.random.Generator(np.random.Philox(key=self.seed, counter=[window, start, 7, epoch]))
            slots = base[rng.permutation(base.size)]
        else:
            slots = _round_robin(counts)
        before = np.empty(slots.size, dtype=np.int64)
        for s in range(len(counts)):
            mask = slots == s
            before[mask] = np.arange(int(mask.sum()))
        if len(self._kept) >= KEPT:
            self._kept.pop(next(iter(self._kept)))
        self._kept[key] = (slots, before)
        return slots, before

    def count_before(self, epoch: int, place: int) -> np.ndarray:
        """Places of each source in ``[0, place)`` of ``epoch``."""
        total = np.zeros(len(self.names), dtype=np.int64)
        segments = self.segments(epoch)
        for j, (start, counts) in enumerate(segments):
            if place <= start:
                break
            stop = min(place, segments[j + 1][0]) if j + 1 < len(segments) else place
            full, rest = divmod(stop - start, self.window)
            total += full * np.asarray(counts, dtype=np.int64)
            if rest:
                slots, _ = self.slots(epoch, start, full, counts)
                total += np.bincount(slots[:rest], minlength=len(counts))
        return total

    def place_after(self, epoch: int, source: int, n: int) -> int:
        """The place just after source ``source``'s ``n``-th place in ``epoch``."""
        segments = self.segments(epoch)
        for j, (start, counts) in enumerate(segments):
            stop = segments[j + 1][0] if j + 1 < len(segments) else None
            q = counts[source]
            full = (n - 1) // q
            slots, before = self.slots(epoch, start, full, counts)
            at = start + full * self.window + int(np.flatnonzero((slots == source) & (before == n - 1 - full * q))[0])
            if stop is None or at < stop:
                return at + 1
            n -= int(self.count_before(epoch, stop)[source] - self.count_before(epoch, start)[source])
        raise AssertionError("unreachable: the last segment is endless")

    def sources_at(self, epoch: int, places: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For global places of ``epoch``: the source of each, and its number among its source's places. Per
        segment, its windows' slots stacked and read in one pass (a batch spans several windows: a pass, masks and
        a count each made an 8192-place plan in 1.1-1.2 ms, 0.95-1.05 ms so): window ``k`` of a segment starts
        after ``k * counts`` places of each source in it."""
        segments = self.segments(epoch)
        starts = np.array([s for s, _ in segments], dtype=np.int64)
        which = np.searchsorted(starts, places, side="right") - 1
        window, offset = np.divmod(places - starts[which], self.window)
        source = np.empty(places.size, dtype=np.int64)
        nth = np.empty(places.size, dtype=np.int64)
        for j in (np.unique(which).tolist() if len(segments) > 1 else [0]):
            start, counts = segments[j]
            at = slice(None) if len(segments) == 1 else which == j
            windows = window[at]
            if not windows.size:
                continue
            low = int(windows.min())
            present = np.bincount(windows - low) > 0  # (the windows met: np.unique's hash took 0.1 ms a batch)
            stacked = [self.slots(epoch, start, k, counts) for k in (np.flatnonzero(present) + low).tolist()]
            row = (np.cumsum(present) - 1)[windows - low]
            column = offset[at]
            s = np.stack([slots for slots, _ in stacked])[row, column]
            source[at] = s
            nth[at] = (self.count_before(epoch, start)[s] + windows * np.asarray(counts, dtype=np.int64)[s]
                       + np.stack([before for _, before in stacked])[row, column])
        return source, nth


class MixOrder(Order):
    """An ``Order`` over a mix's places (see the module's docstring). ``num_samples`` and ``len()`` are those of
    epoch 0 under the weights it was made with; ``shard_size(epoch)`` is each epoch's own (with ``ends`` of
    "first" or "all" an epoch's length follows the weights). ``positions`` gives five columns per place: mix
    index, valid, source, index in the source and own epoch (``make_plan`` makes a ``MixPlan`` of them)."""

    skips_move_positions = False  # (a mix's runner makes every plan's batch from its own places: ``SkipFill.PADDING``)

    def __init__(self, spec: MixSpec, sources: MixedSources, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                 rank: int = 0, world_size: int = 1, last_batch: LastBatch | str = LastBatch.PARTIAL,
                 buffer_rows: int | None = None):
        self.spec = spec
        self.names = spec.names
        self.sizes = sources.sizes
        self.offsets = sources.offsets
        self.windows = Windows(spec.names, spec.weights, spec.window, seed, shuffle)
        self.streams = [_PartStream(part, part_seed(seed, k), shuffle, buffer_rows)
                        for k, part in enumerate(sources.parts)]
        self._drop_from(0)
        self._arguments(self.length(0), batch_size, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size,
                        last_batch=last_batch)

    # ---- weights ------------------------------------------------------------------------------------------
    @property
    def weights(self) -> dict[str, float]:
        """The weights in force last in the schedule (those the next batches are made with)."""
        return dict(zip(self.names, self.windows.schedule[-1][2]))

    def set_weights(self, weights: Mapping[str, float], epoch: int, rank_place: int) -> tuple[int, int]:
        """Draw with ``weights`` from this rank's place ``rank_place`` of ``epoch`` on (the global place
        ``rank_place * world_size``, the same on every rank at the same batch); a place at or past the epoch's
        end means the next epoch's start. Returns the (epoch, global place) where they start."""
        normal = normalised_weights(self.names, weights, self.windows.window, "set_weights")
        place = rank_place * self.world_size
        if place >= self.length(epoch):
            epoch, place = epoch + 1, 0
        self.windows.change(epoch, place, normal)
        self._drop_from(epoch)
        return epoch, place

    def state(self) -> dict[str, Any]:
        return self.windows.state()

    def load(self, state: Mapping[str, Any]) -> None:
        self.windows.load(state)
        self._drop_from(0)

    def _drop_from(self, epoch: int) -> None:
        """Drop what was computed for ``epoch`` and later (the schedule changed from there)."""
        self._lengths = {e: v for e, v in getattr(self, "_lengths", {}).items() if e < epoch}
        self._taken = {e: v for e, v in getattr(self, "_taken", {}).items() if e <= epoch}
        self.windows.forget()

    # ---- the epoch ----------------------------------------------------------------------------------------
    def taken_before(self, epoch: int) -> np.ndarray:
        """Samples of each source's stream taken by the mixed epochs before ``epoch``."""
        if 0 not in self._taken:
            self._taken[0] = np.zeros(len(self.names), dtype=np.int64)
        known = max(e for e in self._taken if e <= epoch)
        taken = self._taken[known]
        for e in range(known, epoch):
            taken = taken + self.windows.count_before(e, self.length(e))
            self._taken[e + 1] = taken
        return taken

    def length(self, epoch: int) -> int:
        """Places in mixed epoch ``epoch`` (all ranks together)."""
        if self.spec.ends is MixEnd.SAMPLES:
            return self.spec.samples or int(self.sizes.sum())
        if epoch not in self._lengths:
            need = self.sizes - self.taken_before(epoch) % self.sizes
            ends = [self.windows.place_after(epoch, s, int(need[s])) for s in range(len(self.names))]
            self._lengths[epoch] = min(ends) if self.spec.ends is MixEnd.FIRST else max(ends)
        return self._lengths[epoch]

    def places(self, epoch: int, places: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For global places of ``epoch``: the mix index, source, index in the source and own epoch of each."""
        source, nth = self.windows.sources_at(epoch, places)
        taken = self.taken_before(epoch)
        local = np.empty(places.size, dtype=np.int64)
        own = np.empty(places.size, dtype=np.int64)
        for s in range(len(self.names)):
            at = np.flatnonzero(source == s)
            if not at.size:
                continue
            stream_places = taken[s] + nth[at]
            if stream_places.size > 1 and not (np.diff(stream_places) > 0).all():  # (padding wraps to the start)
                order = np.argsort(stream_places, kind="stable")
                stream_places, at = stream_places[order], at[order]
            local[at], own[at] = self.streams[s].rows(stream_places)
        return self.offsets[source] + local, source, local, own

    # ---- a rank's share -----------------------------------------------------------------------------------
    def shard_size(self, epoch: int) -> int:
        length = self.length(epoch)
        if self.last_batch is LastBatch.DROP:
            return (length // self.world_size) // self.batch_size * self.batch_size
        samples = -(-length // self.world_size)
        if self.last_batch is LastBatch.PAD:
            samples = -(-samples // self.batch_size) * self.batch_size
        return samples

    def positions(self, epoch: int, start: int, stop: int) -> tuple[np.ndarray, ...]:
        """This rank's positions ``[start, stop)`` of ``epoch``: mix index, valid, source, index in the source
        and own epoch of each (places past the epoch's end repeat its first ones, marked invalid)."""
        length = self.length(epoch)
        places = self.rank + self.world_size * np.arange(start, stop, dtype=np.int64)
        index, source, local, own = self.places(epoch, places % length)
        return index, places < length, source, local, own

    def make_plan(self, columns: tuple[np.ndarray, ...], epoch: int, start: int, last: bool, batch: int,
                  shard: int) -> MixPlan:
        index, valid, source, local, own = columns
        return MixPlan(index, valid, epoch, start, last, batch, shard, source, own, local)

    def epoch(self, epoch: int, start_batch: int = 0, *, start_sample: int | None = None,
              first_batch: int | None = None) -> Iterator[MixPlan]:
        """The epoch's plans, made one at a time (a ``set_weights`` reaches the plans made after it)."""
        number, spans = self.spans(epoch, start_batch, start_sample=start_sample, first_batch=first_batch)
        shard = self.shard_size(epoch)
        for k, (a, b) in enumerate(spans):
            yield self.make_plan(self.positions(epoch, a, b), epoch, a, b == shard, number + k, shard)


def _round_robin(counts: tuple[int, ...]) -> np.ndarray:
    """Smooth weighted round robin over one window: source s gets ``counts[s]`` places, spread evenly."""
    total = sum(counts)
    current = np.zeros(len(counts), dtype=np.int64)
    weights = np.asarray(counts, dtype=np.int64)
    out = np.empty(total, dtype=np.int64)
    for k in range(total):
        current += weights
        pick = int(np.argmax(current))
        out[k] = pick
        current[pick] -= total
    return out
