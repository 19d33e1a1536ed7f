"""Live figures of a loader while it trains: ``loader_stats(loader)`` (``loader.stats()``), and ``log_stats`` to
hand them every N seconds to a callback or a TensorBoard ``SummaryWriter``.

The delivered rate and the trainer's wait share are over the last batches the Loader's ``meter`` (a
``DeliveryMeter``) recorded; stage times are the latest measurement of them (a profile, or auto placement's
profiling), with where they come from.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, ContextManager, TypeVar

from ..pipelines.validate import positive_int, positive_seconds
from .placement.monitors import WaitMonitor

T = TypeVar("T")


class DeliveryMeter:
    """What the trainer got over its last ``window`` batches: how long it waited in ``next()`` for each, and when,
    read from ``monitor``, the one clock of the trainer's waits (the Loader's: its placement controller's, which
    the scheduler reads too; a new one of this meter's own when none is given, ``clock`` its clock). The Loader
    calls ``with meter.waiting(): ...`` around taking a batch, then ``delivered(samples)``."""

    def __init__(self, monitor: WaitMonitor | None = None, *, window: int = 256,
                 clock: Callable[[], float] = time.perf_counter):
        positive_int("window", window)
        if monitor is None:
            monitor = WaitMonitor(clock=clock, kept=window)
        elif not isinstance(monitor, WaitMonitor):
            raise TypeError(f"monitor must be a WaitMonitor or None, got {type(monitor).__name__}")
        self.monitor = monitor
        self.window = min(window, monitor.kept)
        self._mark = monitor.count

    def waiting(self) -> ContextManager[None]:
        return self.monitor.waiting()

    def take(self, get: Callable[[], T]) -> T:
        """``get()`` timed as the trainer's wait for a batch, as ``with meter.waiting(): get()`` times it
        (``WaitMonitor.take``, which the Loader calls itself: once per batch on the trainer's thread)."""
        return self.monitor.take(get)

    def delivered(self, samples: int) -> None:
        self.monitor.delivered(samples)

    def reset(self) -> None:
        """Forget the window (after a pause the trainer made on purpose: evaluation, a checkpoint)."""
        self._mark = self.monitor.count

    def reading(self) -> dict[str, Any]:
        """``delivered_samples_per_s`` and ``trainer_wait_share`` over the window, from the first batch's delivery
        to the last's (None until two batches came), and ``batches`` in it."""
        batches = [(asked, got, n) for asked, got, _, n in self.monitor.since(self._mark) if n is not None]
        batches = batches[-self.window:]
        if len(batches) < 2:
            return {"batches": len(batches), "window_s": 0.0, "delivered_samples_per_s": None,
                    "trainer_wait_share": None}
        span = batches[-1][1] - batches[0][1]
        later = batches[1:]
        return {"batches": len(batches), "window_s": span,
                "delivered_samples_per_s": sum(n for _, _, n in later) / span if span > 0 else None,
                "trainer_wait_share": sum(got - asked for asked, got, _ in later) / span if span > 0 else None}


def loader_stats(loader) -> dict[str, Any]:
    """The loader's figures now: placement, threads and prefetch; delivered rate and trainer wait share over the
    last window (where the Loader records them); per-stage time per sample where measured; skips; placement
    changes so far; a streamed table's gathers that found a chunk not cached (``uncached_gathers``)."""
    plan = loader.plan
    meter = getattr(loader, "meter", None)
    reading = meter.reading() if isinstance(meter, DeliveryMeter) else {
        "batches": 0, "window_s": 0.0, "delivered_samples_per_s": None, "trainer_wait_share": None}
    stages, measured_by = _stage_times(loader, plan)
    history = plan.get("history") or []
    return {"placement": loader.pipeline.describe_cut(loader.cut), "threads": loader.num_threads,
            "prefetch": loader.prefetch, **reading, "skipped": len(loader.skipped),
            "placement_changes": max(len(history) - 1, 0), "stages": stages, "stages_measured_by": measured_by,
            "uncached_gathers": _uncached_gathers(getattr(loader, "source", None))}


def _uncached_gathers(source) -> int | None:
    """Batches a streamed table gathered the grouped way because a chunk they needed was not cached
    (``ChunkedTable.uncached_gathers``; summed over a mix's sources); None where no source counts them."""
    counts = [getattr(s, "uncached_gathers", None) for s in (source, *getattr(source, "parts", ()))]
    counts = [int(c) for c in counts if c is not None]
    return sum(counts) if counts else None


def _stage_times(loader, plan: dict) -> tuple[dict[str, dict], str | None]:
    from .profile import last_profile

    profile = last_profile(loader)
    if profile is not None:
        return ({s["stage"]: {"backend": s["backend"], "ms_per_sample": s["ms_per_sample"]} for s in profile.stages},
                "loader.profile()")
    rows = plan.get("stages")
    if isinstance(rows, list):  # auto placement: what its profiling measured
        size = plan["batch_size"]
        return ({s["stage"]: {"backend": s["backend"], "ms_per_sample": _per_sample(s, size)} for s in rows},
                "auto placement's profiling")
    return {}, None


def _per_sample(stage: dict, batch_size: int) -> float | None:
    ms = stage["gpu_ms_per_batch"] if stage["backend"] == "gpu" else stage["cpu_ms_per_batch"]
    return None if ms is None else ms / batch_size


class StatsLogger:
    """Every ``every_s`` seconds, on a thread of its own, hands ``loader_stats(loader)`` to ``callback`` and/or
    writes its numbers to ``writer`` (anything with TensorBoard's ``add_scalar(tag, value, step)``) under
    ``feedline/``. A placement change since the last call comes as ``event`` in the figures. ``close()`` stops it
    (also ``with log_stats(...)``)."""

    def __init__(self, loader, every_s: float = 30.0, *, callback: Callable[[dict], Any] | None = None,
                 writer: Any = None):
        self.every_s = positive_seconds("every_s", every_s)
        if callback is None and writer is None:
            raise ValueError("log_stats needs a callback, a writer (a TensorBoard SummaryWriter) or both")
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be a function of one dict, got {type(callback).__name__}")
        if writer is not None and not callable(getattr(writer, "add_scalar", None)):
            raise TypeError(f"writer must have add_scalar(tag, value, step), as a TensorBoard SummaryWriter; got "
                            f"{type(writer).__name__}")
        self.loader, self.callback, self.writer = loader, callback, writer
        self.calls = 0
        self._placement: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feedline-stats", daemon=True)
        self._thread.start()

    def log_once(self) -> dict[str, Any]:
        stats = loader_stats(self.loader)
        if self._placement is not None and stats["placement"] != self._placement:
            stats["event"] = f"placement {self._placement} -> {stats['placement']}"
        self._placement = stats["placement"]
        if self.callback is not None:
            self.callback(stats)
        if self.writer is not None:
            for key, value in stats.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(f"feedline/{key}", value, self.calls)
        self.calls += 1
        return stats

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.log_once()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> "StatsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def log_stats(loader, every_s: float = 30.0, *, callback: Callable[[dict], Any] | None = None,
              writer: Any = None) -> StatsLogger:
    """Start handing ``loader_stats(loader)`` every ``every_s`` seconds to ``callback`` and/or ``writer``."""
    return StatsLogger(loader, every_s, callback=callback, writer=writer)
