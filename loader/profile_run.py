"""Running a Loader for its profile: its rate with no trainer (capacity), then under a trainer step, with when
the trainer asked for each batch, got it and finished its step; then the same trainer loop fed from batches
already made (the headroom: what the loop reaches when data costs nothing).

The Loader's position is saved before and loaded back after (``state_dict``), so a profile takes nothing from the
trainer's epochs: the next iteration starts where it would have.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..pipelines.validate import positive_int
from .background import BackgroundStream
from .epochs import batch_size_of, endless

AUTO = "auto"
READY_S = 0.001     # a batch handed over within this was waiting in the queue when the trainer asked
HELD_BATCHES = 8    # batches kept to replay the trainer loop on (the headroom)
HANDOFF_ITEMS = 200  # items handed over to time the batch thread's hand-off

Step = Callable[[dict], Any]


@dataclass(frozen=True)
class Run:
    """One timed stretch of ``batches`` batches: per batch (asked, got, step done), seconds from its start."""

    samples: int
    seconds: float
    timeline: tuple[tuple[float, float, float], ...]

    @property
    def batches(self) -> int:
        return len(self.timeline)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else math.inf

    @property
    def waits(self) -> list[float]:
        return [got - asked for asked, got, _ in self.timeline]

    @property
    def wait_share(self) -> float:
        return sum(self.waits) / self.seconds if self.seconds > 0 else 0.0

    @property
    def ready_share(self) -> float:
        """Batches that were already made and queued when the trainer asked for them."""
        return sum(w < READY_S for w in self.waits) / max(self.batches, 1)

    @property
    def step_s(self) -> float:
        """The trainer's mean step (0.0 with no trainer)."""
        return sum(done - got for _, got, done in self.timeline) / max(self.batches, 1)


def check_step(trainer_step_ms: Any, train_step: Any) -> float | str | None:
    """``trainer_step_ms``: None, ``"auto"`` or milliseconds > 0; ``train_step`` a callable or None; not both."""
    if train_step is not None:
        if not callable(train_step):
            raise TypeError(f"train_step must be a function of one batch, got {type(train_step).__name__}")
        if trainer_step_ms is not None:
            raise ValueError("give trainer_step_ms (a simulated step) or train_step (your own), not both")
        return None
    if trainer_step_ms is None or trainer_step_ms == AUTO:
        return trainer_step_ms
    if isinstance(trainer_step_ms, bool) or not isinstance(trainer_step_ms, (int, float)) \
            or not math.isfinite(trainer_step_ms) or trainer_step_ms <= 0:
        raise ValueError(f"trainer_step_ms must be a positive, finite number of milliseconds, 'auto' or None, got "
                         f"{trainer_step_ms!r}")
    return float(trainer_step_ms)


def sleeper(seconds: float) -> Step:
    """A simulated trainer step: ``time.sleep`` releases the GIL, as a trainer waiting on its GPU kernels does."""
    return lambda batch: time.sleep(seconds)


def timed(stream: Iterator, batches: int, step: Step | None, sync: Callable[[], None]) -> Run:
    """``batches`` batches from ``stream``, running ``step`` on each after taking it."""
    timeline = []
    samples = 0
    sync()
    start = time.perf_counter()
    for _ in range(batches):
        asked = time.perf_counter()
        batch = next(stream)
        got = time.perf_counter()
        samples += batch_size_of(batch)
        if step is not None:
            step(batch)
        timeline.append((asked - start, got - start, time.perf_counter() - start))
    sync()
    return Run(samples, time.perf_counter() - start, tuple(timeline))


@dataclass(frozen=True)
class Measured:
    capacity: Run             # no trainer: the loader's own rate
    loaded: Run | None        # under the trainer's step, when there is one
    headroom: Run | None      # the trainer's step on batches already made
    step_ms: float | None     # the simulated step, when one was given or chosen (auto)
    cache: tuple[dict | None, dict | None] = (None, None)  # the cache's state before and after the capacity run


def warmup_batches(batches: int, prefetch: int, buffer_batches: int = 1, epoch_batches: int | None = None) -> int:
    """Batches taken untimed before the capacity is timed, so that it is the steady state's, as the scheduler's
    model predicts it: as many as are timed, and at least the Loader's whole read-ahead (its queue, its runner's
    own queue and the batch in its batch thread's hands: 2 x prefetch + 1) and, for a streamed table, two shuffle
    buffer-fulls (the first is read as its first batch is made, the next one ahead of it; no more than an epoch).
    Measured on image-train (2,000 photos, batch 64, 2 cores, CPU): after the first 3 batches of a process, the
    next 25 took 1.2-1.3x the CPU time per sample of those after the 40th."""
    positive_int("batches", batches)
    tables = 2 * buffer_batches if buffer_batches > 1 else 0
    if epoch_batches is not None:
        tables = min(tables, epoch_batches)
    return max(batches, 2 * prefetch + 1, tables)


def measure(loader, *, batches: int, trainer_step_ms: float | str | None = None,
            train_step: Step | None = None, warmup: int | None = None) -> Measured:
    """Time ``loader`` as its trainer sees it, then give it back at the position it had. ``warmup``: batches
    taken untimed first (default: 1 + prefetch), so that the capacity is the steady state's."""
    positive_int("batches", batches)
    trainer_step_ms = check_step(trainer_step_ms, train_step)
    warmup = 1 + loader.prefetch if warmup is None else positive_int("warmup", warmup)
    sync = _sync(loader)
    state = loader.state_dict()
    summaries = dict(loader.epoch_summaries)
    # a loaded state pins where the next iteration starts; one broken out of moves on to the next epoch instead
    cursor = getattr(loader, "cursor", None)
    pinned = getattr(cursor, "pinned", None)
    stream = endless(lambda: loader)
    try:
        for _ in range(warmup):  # the first iteration places the pipeline (auto); then its start passes
            next(stream)
        cache_before = cache_state(loader)
        capacity = timed(stream, batches, None, sync)
        cache_after = cache_state(loader)
        step, step_ms = train_step, None
        if trainer_step_ms is not None:
            step_ms = 1000.0 * capacity.seconds / capacity.batches if trainer_step_ms == AUTO else trainer_step_ms
            step = sleeper(step_ms / 1000.0)
        loaded = None
        if step is not None:
            for _ in range(loader.prefetch):  # the queue refills while the trainer steps
                step(next(stream))
            loaded = timed(stream, batches, step, sync)
        held = [next(stream) for _ in range(HELD_BATCHES)] if step is not None else []
    finally:
        stream.close()
        loader.load_state_dict(state)
        if pinned is not None:
            loader.cursor.pinned = pinned
        loader.epoch_summaries.clear()
        loader.epoch_summaries.update(summaries)
        meter = getattr(loader, "meter", None)
        if meter is not None:  # the trainer's live figures do not count the profile's batches
            meter.reset()
    headroom = timed(_replay(held), batches, step, sync) if held else None
    return Measured(capacity, loaded, headroom, step_ms, (cache_before, cache_after))


def cache_state(loader) -> dict | None:
    """Whether the loader's cache of its deterministic prefix is in use now, why, and (images) how much it holds."""
    report = loader.plan.get("cache")
    if not report:
        return None
    return {k: report[k] for k in ("use", "reason", "samples_held") if k in report}


def _replay(held: list) -> Iterator:
    while True:
        yield from held


def _sync(loader) -> Callable[[], None]:
    if getattr(loader.device, "type", "cpu") == "cuda":
        import torch
        return torch.cuda.synchronize
    return lambda: None


def measure_handoff(items: int = HANDOFF_ITEMS) -> float:
    """Seconds per batch of the Loader's hand-off from its batch thread to the trainer's (``BackgroundStream``)
    when the two wait on each other at every batch (a queue one deep, nothing to make): the queue and the
    wake-ups, the per-batch cost a delivered batch carries whatever its size."""
    positive_int("items", items)
    stream = BackgroundStream(lambda: (i for i in range(items + 1)), 1, describe=lambda: "timing the hand-off")
    try:
        next(stream)  # the thread has started
        started = time.perf_counter()
        for _ in range(items):
            next(stream)
        return (time.perf_counter() - started) / items
    finally:
        stream.close()
