"""The table runner's worker threads: results come in plan order whatever order the threads finish in, no more
than ``depth`` plans are taken ahead of the one delivered, an error names the plan's rows, and closing the run
leaves no thread behind unless the threads are kept (then until ``close``)."""
import threading
import time

import numpy as np
import pytest

from feedline.loader.runners.plan_threads import THREAD_PREFIX, PlanThreads
from feedline.loader.sampler import BatchPlan


def plans(n):
    for k in range(n):
        yield BatchPlan(np.arange(10 * k, 10 * k + 10), np.ones(10, bool), batch=k)


def workers():
    return {t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)}


def test_results_come_in_plan_order_and_at_most_depth_plans_ahead():
    taken = []

    def counted(source):
        for plan in source:
            taken.append(plan.batch)
            yield plan

    def work(plan):
        time.sleep(0.02 * (plan.batch % 3 == 0))  # every third plan finishes after later ones
        return plan.batch * 2

    threads = PlanThreads(num_threads=3, depth=4)
    got = []
    for plan, made in threads.run(counted(plans(12)), work):
        assert len(taken) - plan.batch <= 4  # this plan and at most depth - 1 behind it in flight
        got.append((plan.batch, made))
    assert got == [(k, 2 * k) for k in range(12)]


def test_an_error_names_the_plan_and_no_thread_is_left():
    before = workers()

    def work(plan):
        if plan.batch == 3:
            raise OSError("disk went away")
        return plan.batch

    with pytest.raises(OSError, match="disk went away") as info:
        for _ in PlanThreads(num_threads=2, depth=3).run(plans(8), work):
            pass
    assert any("preparing a batch of 10 rows (first [30, 31, 32, 33])" in note for note in info.value.__notes__)
    assert not workers() - before


def test_kept_threads_outlive_a_run_until_close():
    before = workers()
    threads = PlanThreads(num_threads=1, depth=2)  # (two could start their second thread only in the second run)
    threads.keep()
    run = threads.run(plans(6), lambda plan: plan.batch)
    assert next(run)[1] == 0
    run.close()  # closed early: the pending plans are cancelled, the threads stay
    kept = workers() - before
    assert len(kept) >= 1
    assert [made for _, made in threads.run(plans(3), lambda plan: plan.batch)] == [0, 1, 2]
    assert workers() - before == kept  # the same threads ran the second run
    threads.close()
    assert not workers() - before


def test_each_plan_is_warmed_once_ahead_plans_before_it_is_made_and_a_failed_warming_is_ignored():
    events = []
    lock = threading.Lock()

    def warm(plan, part, parts):
        with lock:
            events.append(("warm", plan.batch, part, parts))
        if plan.batch == 5:
            raise OSError("read later, by the plan itself")

    def work(plan):
        with lock:
            events.append(("make", plan.batch))
        return plan.batch

    threads = PlanThreads(num_threads=1, depth=2)  # one thread: tasks start in the order queued
    got = [made for _, made in threads.run(plans(10), work, warm=warm, ahead=3)]
    assert got == list(range(10))
    warmed = [e for e in events if e[0] == "warm"]
    assert [(k, part, parts) for _, k, part, parts in warmed] == [(k, k % 3, 3) for k in range(10)]
    for k in range(10):  # plan k is warmed before plan k - 3 is made, so before plans k - 2 .. k; but the first 3
        # tasks (plans 0, 1, 2) make their plan first: nobody warmed it before, it waits for no later one's warming
        made_before = [e[1] for e in events[:events.index(("warm", k, k % 3, 3))] if e[0] == "make"]
        assert made_before == list(range(max(k - 3, 0) + (k - 3 < 3)))
