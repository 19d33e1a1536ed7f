"""The simulated trainer's step overrun split into waking late (the OS) and waiting for the GIL
(``benchmarks/stamped_sleep.py``, ``trainer.run_trainer``): where the split can be known, because a thread of the
test holds the GIL through a step, the trainer's measured GIL wait covers that hold; with nothing else running it
stays far under it; where the native sleep cannot be had, the keys are None.

No assertion on the machine's speed: a hold is compared with what the trainer measured around it, and the hold
is long (tens of ms) next to a step's wake-up."""
import itertools
import math
import sys
import threading
import time

import numpy as np
import pytest

from feedline.benchmarks import stamped_sleep, trainer
from feedline.benchmarks.trainer import ceiling_summary, run_trainer, trainer_summary

HOLD_S, STEP_S, SIZE = 0.08, 0.002, 4
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the native sleep is Linux's")


def batches(hold_at: int | None = None, held: list | None = None):
    """An endless stream of ready batches; with ``hold_at``, taking batch ``hold_at`` lets a thread of its own
    hold the GIL for ``HOLD_S`` in a pure-Python loop as soon as it can take it (when the trainer sleeps), noting
    the hold's start and end (``time.perf_counter``) in ``held``."""
    start = threading.Event()

    def hold():
        start.wait()
        began = time.perf_counter()
        while time.perf_counter() - began < HOLD_S:
            pass
        held.append((began, time.perf_counter()))

    holder = threading.Thread(target=hold, daemon=True) if hold_at is not None else None
    if holder is not None:
        holder.start()
    try:
        for taken in itertools.count():
            if taken == hold_at:
                start.set()
            yield {"x": np.zeros((SIZE, 2))}
    finally:
        if holder is not None:
            start.set()
            holder.join()


def run_with_long_switches(stream, steps: int) -> dict:
    """``run_trainer`` per step, with the interpreter's switch interval at 10 s (put back after): a thread holding
    the GIL gives it up only when it blocks or ends, never at the default 5 ms."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        return run_trainer(stream, steps, STEP_S, per_step=True)
    finally:
        sys.setswitchinterval(switch)


@linux_only
def test_the_sleep_wakes_after_its_deadline_on_perf_counters_clock():
    sleep_until = trainer.native_sleep()
    assert sleep_until is not None
    for step_ns in (0, 300_000, 2_000_000):
        before = time.perf_counter_ns()
        woke = sleep_until(before + step_ns)
        after = time.perf_counter_ns()
        # the same clock as perf_counter: the stamp falls between two of its readings, after the deadline
        assert before + step_ns <= woke <= after


@linux_only
def test_a_thread_holding_the_gil_through_a_step_is_measured_as_gil_wait():
    held: list = []
    stream = batches(hold_at=2, held=held)
    run = run_with_long_switches(stream, 6)
    stream.close()
    (began, ended), = held
    late, gil = run["woke_late_each_s"], run["gil_wait_each_s"]
    # The hold starts once the trainer sleeps (it held the GIL until then): in step 2, or a later one where the
    # holder was not on a core before the trainer woke. That step began before the hold and ran Python again after
    # it, so its late + GIL wait covers the hold past the step; no other step can overlap it.
    hit = max(range(6), key=lambda i: late[i] + gil[i])
    assert hit >= 2 and late[hit] + gil[hit] >= (ended - began) - STEP_S
    # the OS woke the trainer well within the hold, which it then waited for: most of the hold is GIL wait
    assert gil[hit] >= 0.5 * HOLD_S
    assert max(gil[:hit] + gil[hit + 1:]) < 0.25 * HOLD_S  # the other steps overlap no hold
    assert run["gil_wait_share"] == pytest.approx(sum(gil) / run["seconds"])
    assert run["gil_wait_s"] == pytest.approx(sum(gil) / 6) and run["woke_late_s"] == pytest.approx(sum(late) / 6)


@linux_only
def test_with_nothing_else_running_the_gil_wait_stays_far_under_a_hold():
    run = run_with_long_switches(batches(), 20)
    assert len(run["gil_wait_each_s"]) == 20 and max(run["gil_wait_each_s"]) < 0.25 * HOLD_S
    assert min(run["woke_late_each_s"]) >= 0  # the deadline is never missed the other way
    # a step's measured length is exactly its step, its lateness and its GIL wait
    for slept, late, gil in zip(run["slept_each_s"], run["woke_late_each_s"], run["gil_wait_each_s"]):
        assert math.isclose(slept, STEP_S + late + gil, rel_tol=0, abs_tol=1e-8)
    assert math.isclose(run["slept_s"] - STEP_S, run["woke_late_s"] + run["gil_wait_s"], rel_tol=0, abs_tol=1e-8)


def test_where_the_native_sleep_is_not_available_the_split_is_none(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert stamped_sleep.sleeper() is None and trainer.native_sleep() is None
    run = run_trainer(batches(), 3, STEP_S, per_step=True)
    assert run["slept_s"] >= STEP_S and len(run["slept_each_s"]) == 3  # time.sleep was the step
    assert run["woke_late_s"] is run["gil_wait_s"] is run["gil_wait_share"] is None
    assert run["woke_late_each_s"] == run["gil_wait_each_s"] == []
    summary = trainer_summary({"feedline": [run, run]}, {"feedline": [run]}, STEP_S, auto=False, baseline=None,
                              paired=True)
    ceiling = ceiling_summary([run], STEP_S)
    assert summary["trainer_woke_late_ms"] is summary["trainer_gil_wait_ms"] is None
    assert summary["trainer_gil_wait_share"] is None
    assert ceiling["trainer_ceiling_woke_late_ms"] is ceiling["trainer_ceiling_gil_wait_share"] is None


def test_the_native_sleep_needs_linux_perf_counters_clock_and_a_64_bit_long():
    linux = "clock_gettime(CLOCK_MONOTONIC)"
    assert stamped_sleep.usable("linux", linux, 8)
    assert not stamped_sleep.usable("darwin", "mach_absolute_time()", 8)
    assert not stamped_sleep.usable("linux", "clock_gettime(CLOCK_MONOTONIC_RAW)", 8)
    assert not stamped_sleep.usable("linux", linux, 4)


@linux_only
def test_the_summaries_give_the_rounds_medians():
    runs = [run_trainer(batches(), 4, STEP_S) for _ in range(3)]
    summary = trainer_summary({"feedline": runs + runs[:1]}, {"feedline": runs}, STEP_S, auto=False, baseline=None,
                              paired=True)
    ceiling = ceiling_summary(runs, STEP_S)
    for key, name, scale in (("woke_late_s", "woke_late_ms", 1e3), ("gil_wait_s", "gil_wait_ms", 1e3),
                             ("gil_wait_share", "gil_wait_share", 1.0)):
        median = scale * sorted(r[key] for r in runs)[1]
        assert summary["trainer_" + name] == median and ceiling["trainer_ceiling_" + name] == median
