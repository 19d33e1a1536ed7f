"""A simulated trainer, written once for every benchmark: throughput as a training job sees it.

For every batch it takes, the trainer sleeps a fixed step on the iterating thread. The sleep (``time.sleep``'s,
see :mod:`feedline.benchmarks.stamped_sleep`) releases the GIL, as a GPU trainer waiting on its kernels does, so
a loader that makes its batches on threads of its own keeps working during the step, while one that makes them
inside ``next()`` makes the trainer wait. The trainer records how long it is blocked in ``next()``.

Words used in the reports:

* capacity: samples/s of a bare ``for batch in loader`` loop (no trainer);
* demand: samples/s the trainer would take if it never waited (mean batch size / step);
* delivered: samples/s with the trainer, step included;
* efficiency: delivered / min(capacity, demand), 1.0 when the loader hides entirely behind the step. With
  :func:`paired_rounds` each trainer round sits between two capacity rounds of the same loader, its capacity is
  theirs pooled (samples / seconds of both), and the reported efficiency is the median of the rounds' own;
* wait share: seconds blocked in ``next()`` / seconds of the whole timed loop, with the trainer;
* overrun: the mean measured step minus the step asked for, split where it can be into the trainer waking late
  (the OS) and waiting for the GIL after waking (another thread's Python): see :func:`run_trainer`.

Loaders are compared in alternating rounds (:func:`alternate`, :func:`paired_rounds`), each reporting its median
round.
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import math
import statistics
import sys
import time
from typing import Callable, Iterable, Iterator, Mapping

from tqdm import tqdm

from ..loader.devices import gpu_available
from ..loader.epochs import endless, measure_loader
from ..pipelines.validate import finite_at_least, int_at_least, positive_int

AUTO = "auto"
# A round is at least this many times the largest read-ahead, and starts by taking the read-ahead untimed: the
# queue a loader fills while it waits for its turn is never counted as made during the round.
ROUND_OVER_READAHEAD = 4


def check_trainer_step(trainer_step_ms: object) -> float | str | None:
    """``trainer_step_ms`` as given to a benchmark: None (no trainer), ``"auto"``, or a positive finite number
    of milliseconds; anything else is a ``ValueError``/``TypeError`` naming it."""
    if trainer_step_ms is None or trainer_step_ms == AUTO:
        return trainer_step_ms
    if isinstance(trainer_step_ms, bool) or not isinstance(trainer_step_ms, (int, float)):
        raise TypeError(f"trainer_step_ms must be a number of milliseconds, 'auto' or None, got "
                        f"{type(trainer_step_ms).__name__} {trainer_step_ms!r}")
    if not (math.isfinite(trainer_step_ms) and trainer_step_ms > 0):
        raise ValueError(f"trainer_step_ms must be a positive, finite number of milliseconds or 'auto', got "
                         f"{trainer_step_ms!r}")
    return float(trainer_step_ms)


def cuda_sync() -> Callable[[], None] | None:
    """``torch.cuda.synchronize`` where a CUDA GPU is usable, else None: call it before every clock read, so
    that work still queued on the device is counted. Call it once before the first timed region too (the first
    call creates the CUDA context, which must not land inside a measurement)."""
    if gpu_available():
        import torch
        return torch.cuda.synchronize
    return None


_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30


@contextlib.contextmanager
def exact_sleeps():
    """On Linux, this thread's timer slack at 1 ns inside the block (put back after): ``time.sleep`` otherwise
    ends up to 50 us late (the default slack; measured on an idle 2-core VM: a 3 ms sleep overran by a median
    0.087 ms, 0.038 ms with 1 ns), which is the simulation's own cost, not the loader's: a GPU trainer waits
    for an event (a futex or a spin), which no timer slack delays."""
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            prctl = ctypes.CDLL(None).prctl
        except (OSError, AttributeError):
            prctl = None
    before = prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0) if prctl is not None else -1
    if before > 0:
        prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)
    try:
        yield
    finally:
        if before > 0:
            prctl(_PR_SET_TIMERSLACK, before, 0, 0, 0)


def run_trainer(stream: Iterator, batches: int, step_s: float, sync: Callable[[], None] | None = None, *,
                warmup: int = 0, per_step: bool = False) -> dict:
    """Take ``batches`` batches from ``stream`` (an endless iterator, e.g. ``feedline.loader.epochs.endless(lambda:
    loader)``), sleeping ``step_s`` seconds on this thread after each one, after ``warmup`` batches taken the same
    way but not timed. ``step_s=0`` is the bare loop, i.e. the loader's capacity. ``sync`` runs before the clock
    starts and before it stops (``torch.cuda.synchronize`` on a GPU; see :func:`cuda_sync`).

    Returns ``samples_per_s`` (delivered, step included), ``batches``, ``samples``, ``seconds`` (the timed loop),
    ``wait_s`` (blocked in ``next()``), ``wait_share`` (``wait_s / seconds``), ``step_s`` and
    ``demand_samples_per_s`` (``samples / (batches * step_s)``, the rate if the trainer never waited; ``inf``
    with no step) and ``slept_s`` (the mean measured length of a step: more than ``step_s`` when the machine is
    too busy to wake the trainer on time). The step's overrun (``slept_s - step_s``) is split where the step is
    :func:`feedline.benchmarks.stamped_sleep.sleeper`'s sleep: ``woke_late_s`` (mean a step: the OS woke the
    thread after its deadline), ``gil_wait_s`` (mean a step: from waking to running Python again, the GIL held by
    another thread) and ``gil_wait_share`` (all the steps' GIL waits / ``seconds``); None for the three with no
    step or where that sleep is not available (``time.sleep`` is the step then). With ``per_step``, also
    ``waits_s``, ``slept_each_s``, ``woke_late_each_s`` and ``gil_wait_each_s``: every timed batch's time in
    ``next()``, its measured step and that step's split (empty lists where there is no split).
    """
    finite_at_least("step_s", step_s, 0)
    int_at_least("warmup", warmup, 0)
    sleep_until = native_sleep() if step_s else None  # before any clock: its first call compiles or loads it
    step_ns = round(step_s * 1e9)
    waits: list[float] = []
    slept: list[float] = []
    late: list[int] = []
    gil: list[int] = []
    taken = [0]

    def trained():
        while True:
            began = time.perf_counter()
            try:
                batch = next(stream)
            except StopIteration:
                raise ValueError(f"the stream ended after {taken[0]} batches; run_trainer needs an endless "
                                 f"stream (feedline.loader.epochs.endless(lambda: loader))") from None
            waits.append(time.perf_counter() - began)
            taken[0] += 1
            if sleep_until is not None:
                began_ns = time.perf_counter_ns()
                woke_ns = sleep_until(began_ns + step_ns)  # the step: releases the GIL, as time.sleep
                running_ns = time.perf_counter_ns()
                late.append(woke_ns - began_ns - step_ns)
                gil.append(running_ns - woke_ns)
                slept.append((running_ns - began_ns) * 1e-9)
            elif step_s:
                began = time.perf_counter()
                time.sleep(step_s)  # the step: releases the GIL, as a trainer waiting on its GPU kernels
                slept.append(time.perf_counter() - began)
            yield batch

    steps = trained()
    for _ in range(warmup):
        next(steps)
    for kept in (waits, slept, late, gil):
        kept.clear()
    # measure_loader's clock covers `batches` whole iterations: each is next() on the loader, then the step
    with exact_sleeps():
        timed = measure_loader(lambda: steps, batches, 0, sync=sync)
    steps.close()
    seconds = timed["seconds"]
    split = sleep_until is not None
    result = {**timed, "wait_s": sum(waits), "wait_share": sum(waits) / seconds, "step_s": float(step_s),
              "slept_s": sum(slept) / batches,
              "demand_samples_per_s": timed["samples"] / (batches * step_s) if step_s else math.inf,
              "woke_late_s": sum(late) * 1e-9 / batches if split else None,
              "gil_wait_s": sum(gil) * 1e-9 / batches if split else None,
              "gil_wait_share": sum(gil) * 1e-9 / seconds if split else None}
    if per_step:
        result["waits_s"], result["slept_each_s"] = list(waits), list(slept)
        result["woke_late_each_s"], result["gil_wait_each_s"] = [t * 1e-9 for t in late], [t * 1e-9 for t in gil]
    return result


def native_sleep() -> Callable[[int], int] | None:
    """The trainer's step where its overrun can be split (:func:`feedline.benchmarks.stamped_sleep.sleeper`), else
    None (``time.sleep`` is the step)."""
    try:
        from .stamped_sleep import sleeper
    except ImportError:  # no numba
        return None
    return sleeper()


def efficiency(delivered: float, capacity: float, demand: float) -> float:
    """``delivered / min(capacity, demand)``: the share of what the trainer could have had, given what the loader
    can make (capacity) and what the trainer can take (demand = mean batch size / step; ``inf`` with no step)."""
    for name, value in (("delivered", delivered), ("capacity", capacity), ("demand", demand)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
            raise ValueError(f"{name} must be a number of samples/s >= 0, got {value!r}")
    if capacity <= 0 or demand <= 0:
        raise ValueError(f"capacity and demand must be > 0, got capacity={capacity!r}, demand={demand!r}")
    return delivered / min(capacity, demand)


def alternate(streams: Mapping[str, Iterator], *, rounds: int, per_round: int, untimed: int, step_s: float = 0.0,
              settle_s: float = 0.0, sync: Callable[[], None] | None = None,
              on_turn: Callable[[str], None] | None = None) -> dict[str, list[dict]]:
    """``rounds`` rounds; in each, every stream in turn gets :func:`run_trainer` over ``per_round`` timed batches
    after ``untimed`` ones (at least a loader's read-ahead, which fills while it waits for its turn, so that it
    does not count as made in the round), after a ``settle_s`` pause (the other loaders' read-ahead refills
    during it instead of during the timed batches). Returns every round's result per stream."""
    positive_int("rounds", rounds)
    positive_int("per_round", per_round)
    results: dict[str, list[dict]] = {name: [] for name in streams}
    for _ in range(rounds):
        for name, stream in streams.items():
            if on_turn is not None:
                on_turn(name)
            if settle_s:
                time.sleep(settle_s)
            results[name].append(run_trainer(stream, per_round, step_s, sync, warmup=untimed))
    return results


def paired_rounds(makers: Mapping[str, Callable[[], Iterable]], *, readahead: Mapping[str, int], rounds: int,
                  per_round: int, step: float | str | None = None, round_s: float | None = None, warmup: int = 0,
                  settle_s: float = 0.0, sync: Callable[[], None] | None = None, progress: bool = False,
                  desc: str = "bench", main: str = "feedline", ceiling: bool = False) -> dict:
    """Every loader of ``makers`` (name -> ``lambda: loader``, run epoch after epoch) in turn, each turn after a
    ``settle_s`` pause (the other loaders' read-ahead refills during it instead of during the timed batches).

    A round is :func:`run_trainer` over a loader's ``per_round`` timed batches (raised to ``ROUND_OVER_READAHEAD``
    times the largest ``readahead``) after ``untimed`` = that read-ahead (what a loader made while it waited for
    its turn is not counted as made in the round). With ``round_s``, each loader first runs one such round
    untimed, and its rounds are then raised to the batches it made in ``round_s`` seconds there, so that every
    round is long enough to be steady whatever its batch time.

    Then one capacity round (no trainer) per loader, and with ``step`` (milliseconds, or ``"auto"``: ``main``'s
    batch time in that first capacity round), ``rounds`` turns of a trainer round followed by a capacity round:
    every trainer round sits between two capacity rounds of its loader (see :func:`trainer_summary`'s
    ``paired``). With no ``step``, ``rounds`` capacity rounds in all.

    With ``ceiling`` and a step, each turn ends with a ceiling round: the same trainer, step and batches as
    ``main``'s rounds, over a loader that costs nothing (the same batch again, :func:`free_batches`), after the
    same pause: what the simulation itself reaches at best on this machine now (its sleeps wake late).

    Returns ``capacity`` and ``loaded`` (None with no step): every round's result per loader; ``ceiling`` (the
    ceiling rounds, or None); ``step_s``; ``per_round`` (timed batches per round, per loader) and ``untimed``."""
    positive_int("rounds", rounds)
    untimed = max(max(readahead.values()), 1)
    counts = {name: max(positive_int("per_round", per_round), ROUND_OVER_READAHEAD * untimed) for name in makers}
    turns = 1 + (2 * rounds if step is not None else rounds - 1) + bool(round_s)
    with tqdm(total=len(makers) * (warmup + turns * (untimed + max(counts.values()))), desc=desc, unit="batch",
              disable=not progress) as bar:
        streams = {name: counted(endless(make), lambda: bar.update(1)) for name, make in makers.items()}

        def turn(name: str, step_s: float) -> dict:
            bar.set_description(f"{desc} {name}" + (f" + trainer {step_s * 1e3:.1f} ms" if step_s else ""))
            return run_trainer(streams[name], counts[name], step_s, sync, warmup=untimed)

        def settle() -> None:
            if settle_s:
                time.sleep(settle_s)

        try:
            for stream in streams.values():
                for _ in range(warmup):
                    next(stream)
            if round_s:
                for name in streams:
                    settle()
                    first = turn(name, 0.0)
                    counts[name] = max(counts[name], math.ceil(round_s * first["batches"] / first["seconds"]))
                bar.total = bar.n + sum((turns - 1) * (untimed + n) for n in counts.values())
                bar.refresh()
            capacity: dict[str, list[dict]] = {name: [] for name in streams}
            for name in streams:
                settle()
                capacity[name].append(turn(name, 0.0))
            step_s = None if step is None else resolve_step_s(step, capacity[main])
            loaded = None if step_s is None else {name: [] for name in streams}
            free = free_batches(capacity[main][0]) if ceiling and step_s is not None else None
            ceilings = None if free is None else []
            for _ in range(rounds if step_s is not None else rounds - 1):
                for name in streams:
                    settle()
                    if loaded is not None:
                        loaded[name].append(turn(name, step_s))
                    capacity[name].append(turn(name, 0.0))
                if free is not None:
                    settle()
                    bar.set_description(f"{desc} trainer ceiling {step_s * 1e3:.1f} ms")
                    ceilings.append(run_trainer(free, counts[main], step_s, sync, warmup=untimed))
        finally:
            for stream in streams.values():
                stream.close()
    return {"capacity": capacity, "loaded": loaded, "ceiling": ceilings, "step_s": step_s, "per_round": counts,
            "untimed": untimed}


def free_batches(like: dict) -> Iterator:
    """A loader that costs nothing: the same batch, endlessly, of the mean size of the round ``like``."""
    import numpy as np

    return itertools.repeat(np.zeros(max(round(like["samples"] / like["batches"]), 1), dtype=np.uint8))


def ceiling_summary(runs: list[dict], step_s: float) -> dict:
    """The report's keys of the ceiling rounds (:func:`paired_rounds` with ``ceiling``): the trainer's
    efficiency over a loader that costs nothing (delivered / demand: only the step's own overrun and the loop
    keep it under 1), median and per round, its step overrun (measured - asked), its wait share and
    :func:`overrun_split`'s ``trainer_ceiling_`` keys."""
    each = [efficiency(r["samples_per_s"], math.inf, r["demand_samples_per_s"]) for r in runs]
    return {"trainer_ceiling_efficiency": statistics.median(each),
            "trainer_ceiling_efficiency_per_round": [round(e, 3) for e in each],
            "trainer_ceiling_overrun_ms": 1000.0 * (statistics.median(r["slept_s"] for r in runs) - step_s),
            "trainer_ceiling_wait_share": statistics.median(r["wait_share"] for r in runs),
            **overrun_split(runs, "trainer_ceiling_")}


def overrun_split(runs: list[dict], prefix: str) -> dict:
    """``{prefix}woke_late_ms``, ``{prefix}gil_wait_ms`` (each the median over ``runs`` of the round's mean a step)
    and ``{prefix}gil_wait_share`` (median): see :func:`run_trainer`. None where a round has no split."""
    keys = {}
    for key, name, scale in (("woke_late_s", "woke_late_ms", 1e3), ("gil_wait_s", "gil_wait_ms", 1e3),
                             ("gil_wait_share", "gil_wait_share", 1.0)):
        values = [r.get(key) for r in runs]
        keys[prefix + name] = None if None in values else scale * statistics.median(values)
    return keys


CEILING_NOTE = ("trainer_ceiling_efficiency: the same trainer rounds (same step and batches as feedline's) over a "
                "loader that costs nothing (the same batch again), one after each turn of the trainer rounds, "
                "median: what the simulation itself reaches at best on this machine now, held under 1 by the "
                "step's sleep waking late (trainer_ceiling_overrun_ms) and the loop's own time; efficiency is "
                "measured as before, so compare it with this ceiling, not with 1")
SPLIT_NOTE = ("trainer_woke_late_ms, trainer_gil_wait_ms and trainer_gil_wait_share (the same with baseline_ for "
              "the baseline's trainer rounds and trainer_ceiling_ for the ceiling rounds): where the trainer's steps "
              "overran, each the median over rounds of the round's own. The step is a sleep that reads the clock "
              "the moment the thread wakes, before it takes the GIL back: woke late = the OS woke the trainer's "
              "thread after the step's deadline (other threads held the cores), GIL wait = from waking to running "
              "Python again (another thread held the GIL), both mean ms a step (a round's step overrun is their "
              "sum); trainer_gil_wait_share = the GIL waits' seconds / the round's seconds, what the loader's "
              "Python costs the trainer. None where that sleep is not available (not Linux; time.sleep is the step)")


def median_rate(runs: list[dict]) -> float:
    return statistics.median(r["samples_per_s"] for r in runs)


def auto_step_s(capacity_runs: list[dict]) -> float:
    """The loader's own batch time with no trainer: one over its median batch rate (batches/s) over the rounds."""
    return 1.0 / statistics.median(r["batches"] / r["seconds"] for r in capacity_runs)


def resolve_step_s(trainer_step_ms: float | str, capacity_runs: list[dict]) -> float:
    """Seconds per step: ``trainer_step_ms`` / 1000, or with ``"auto"`` the batch time of ``capacity_runs``."""
    return auto_step_s(capacity_runs) if trainer_step_ms == AUTO else trainer_step_ms / 1000.0


def pooled_rate(runs: list[dict]) -> float:
    """Samples/s of ``runs`` taken together: all their samples over all their seconds."""
    return sum(r["samples"] for r in runs) / sum(r["seconds"] for r in runs)


def paired_efficiencies(capacity_runs: list[dict], loaded_runs: list[dict]) -> list[float]:
    """Each trainer round's efficiency, from :func:`paired_rounds`' order (capacity, trainer, capacity, ...):
    trainer round ``i`` delivered / min(its capacity, its demand), its capacity being the capacity rounds just
    before and after it pooled (:func:`pooled_rate`), so that a machine slower or faster for a while weighs on
    both sides of the ratio alike."""
    if len(capacity_runs) != len(loaded_runs) + 1:
        raise ValueError(f"paired rounds need one capacity round more than trainer rounds, got "
                         f"{len(capacity_runs)} and {len(loaded_runs)}")
    return [efficiency(run["samples_per_s"], pooled_rate(capacity_runs[i:i + 2]), run["demand_samples_per_s"])
            for i, run in enumerate(loaded_runs)]


def trainer_summary(capacity: Mapping[str, list[dict]], loaded: Mapping[str, list[dict]], step_s: float, *,
                    auto: bool, main: str = "feedline", baseline: str | None = "baseline",
                    paired: bool = False) -> dict:
    """The report's trainer keys from capacity rounds (no trainer) and loaded rounds (``step_s`` per batch):
    ``trainer_step_ms``, ``trainer_step_auto``, ``trainer_step_measured_ms``, ``trainer_step_overrun_ms``
    (measured - asked), ``demand_samples_per_s``, ``capacity_samples_per_s``, ``delivered_samples_per_s``,
    ``efficiency``, ``trainer_wait_share`` and :func:`overrun_split`'s ``trainer_`` keys for ``main``, and where
    ``baseline`` was measured the same with a ``baseline_`` prefix plus ``delivered_speedup`` (main delivered /
    baseline delivered) and ``delivered_speedup_per_round``. Each figure is the median over rounds.
    ``efficiency``: with ``paired`` (rounds from :func:`paired_rounds`) the median of :func:`paired_efficiencies`
    (also given per round as ``efficiency_per_round``); otherwise delivered / min(capacity, demand) of the medians."""
    measured = statistics.median(r["slept_s"] for r in loaded[main])
    result = {"trainer_step_ms": step_s * 1000.0, "trainer_step_auto": auto,
              "trainer_step_measured_ms": 1000.0 * measured, "trainer_step_overrun_ms": 1000.0 * (measured - step_s)}
    result["demand_samples_per_s"] = statistics.median(r["demand_samples_per_s"] for r in loaded[main])
    for name, prefix in ((main, ""), (baseline, "baseline_")):
        if name is None or name not in loaded:
            continue
        cap, got = median_rate(capacity[name]), median_rate(loaded[name])
        demand = statistics.median(r["demand_samples_per_s"] for r in loaded[name])
        result[f"{prefix}capacity_samples_per_s"] = cap
        result[f"{prefix}delivered_samples_per_s"] = got
        if paired:
            each = paired_efficiencies(capacity[name], loaded[name])
            result[f"{prefix}efficiency"] = statistics.median(each)
            result[f"{prefix}efficiency_per_round"] = [round(e, 3) for e in each]
        else:
            result[f"{prefix}efficiency"] = efficiency(got, cap, demand)
        result[f"{prefix}trainer_wait_share"] = statistics.median(r["wait_share"] for r in loaded[name])
        result.update(overrun_split(loaded[name], f"{prefix}trainer_"))
    if baseline is not None and baseline in loaded:
        result["delivered_speedup"] = result["delivered_samples_per_s"] / result["baseline_delivered_samples_per_s"]
        result["delivered_speedup_per_round"] = [round(f["samples_per_s"] / b["samples_per_s"], 3)
                                                 for f, b in zip(loaded[main], loaded[baseline])]
    return result


def counted(stream: Iterator, tick: Callable[[], None]) -> Iterator:
    """``stream``, calling ``tick()`` after every batch (a progress bar's ``update``)."""
    for batch in stream:
        tick()
        yield batch
