"""The loader's threads run below the trainer's (Linux: nice is per thread): the worker threads at the main
thread's nice + ``WORKER_THREADS``, the batch thread at + ``BATCH_THREAD``; the main thread itself is never
changed, and a thread already lower is left as it is."""
import os
import sys
import threading
import time

import pytest

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import Loader
from feedline.loader.background import THREAD_NAME
from feedline.loader.runners.plan_threads import THREAD_PREFIX
from feedline.loader.thread_priority import BATCH_THREAD, MAX_NICE, WORKER_THREADS, lower_this_thread
from feedline.pipelines.criteo import criteo

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")


def nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def on_thread(fn):
    out = {}

    def run():
        out["tid"] = threading.get_native_id()
        out["before"] = nice(out["tid"])
        out["changed"] = fn()
        out["after"] = nice(out["tid"])

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out


def test_a_loaders_threads_run_below_the_main_thread(tmp_path):
    make_criteo(tmp_path / "c.tsv", 3000, seed=0)
    main = nice(threading.get_native_id())
    loader = Loader(criteo(tmp_path / "c.tsv"), 256, placement="cpu", num_threads=2, cache="off")
    expected = {THREAD_NAME: min(main + BATCH_THREAD, MAX_NICE), **{f"{THREAD_PREFIX}_{k}": min(
        main + WORKER_THREADS, MAX_NICE) for k in range(2)}}
    try:
        stream = iter(loader)
        next(stream)  # made on the batch thread by a worker: the threads run (a worker may not have started work)
        deadline = time.monotonic() + 30
        while True:
            seen = {t.name: nice(t.native_id) for t in threading.enumerate() if t.name in expected}
            if seen == expected or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        for _ in stream:
            pass
    finally:
        loader.close()
    assert seen == expected
    assert nice(threading.get_native_id()) == main


def test_the_main_thread_is_never_changed():
    before = nice(threading.get_native_id())
    assert threading.current_thread() is threading.main_thread()
    assert lower_this_thread(WORKER_THREADS) is False
    assert nice(threading.get_native_id()) == before


def test_a_thread_already_lower_is_left_alone():
    main = nice(os.getpid())
    lowest = on_thread(lambda: (os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), MAX_NICE),
                                lower_this_thread(3))[1])
    assert lowest["changed"] is False and lowest["after"] == MAX_NICE
    plain = on_thread(lambda: lower_this_thread(3))
    assert plain["changed"] is (plain["before"] < min(main + 3, MAX_NICE))
    assert plain["after"] == max(plain["before"], min(main + 3, MAX_NICE))
    assert on_thread(lambda: lower_this_thread(0))["changed"] is False
