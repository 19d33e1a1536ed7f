"""The thread taking a BackgroundStream's batches (the trainer's) holds a short scheduler slice while the stream
is open, so that it wakes from its step onto a core without waiting for a loader thread's slice to end; its own
slice comes back when the stream closes. Where the kernel cannot say a thread's slice, the test is skipped."""
import re
import threading

import pytest

from feedline.benchmarks.trainer import exact_sleeps
from feedline.loader import latency
from feedline.loader.background import BackgroundStream


def _own_slice():
    tid = threading.get_native_id()
    before = latency.slice_ns(tid)
    if before is None or not latency.enabled():
        pytest.skip("no sched_getattr here")
    return tid, before


def test_the_taking_thread_has_a_short_slice_while_the_stream_is_open():
    tid, before = _own_slice()
    stream = BackgroundStream(lambda: (i for i in range(5)), 2)
    assert next(stream) == 0
    assert latency.slice_ns(tid) == latency.SLICE_NS  # (fails on the old stream: it left the thread alone)
    assert list(stream) == [1, 2, 3, 4]
    stream.close()
    assert latency.slice_ns(tid) == before
    stream.close()  # twice: nothing more to put back
    assert latency.slice_ns(tid) == before


def test_two_streams_on_one_thread_put_the_slice_back_after_the_last():
    tid, before = _own_slice()
    a, b = BackgroundStream(lambda: (i for i in range(3)), 1), BackgroundStream(lambda: (i for i in range(3)), 1)
    next(a), next(b)
    a.close()
    assert latency.slice_ns(tid) == latency.SLICE_NS
    b.close()
    assert latency.slice_ns(tid) == before


def test_switched_off_by_the_environment(monkeypatch):
    tid, before = _own_slice()
    monkeypatch.setenv("FEEDLINE_TRAINER_SLICE", "0")
    stream = BackgroundStream(lambda: (i for i in range(3)), 1)
    next(stream)
    assert latency.slice_ns(tid) == before
    stream.close()


@pytest.mark.parametrize("value", ["off", "false", "", " 0", "2", "on"])
def test_an_unknown_switch_value_is_refused_by_name(monkeypatch, value):
    # (the old code read every value but "0" as on, so "off" switched the slice on)
    monkeypatch.setenv("FEEDLINE_TRAINER_SLICE", value)
    with pytest.raises(ValueError, match=r"FEEDLINE_TRAINER_SLICE must be '1' .* or '0' .*, got " + re.escape(repr(value))):
        latency.enabled()
    stream = BackgroundStream(lambda: (i for i in range(3)), 1)
    try:
        with pytest.raises(ValueError, match="FEEDLINE_TRAINER_SLICE"):
            next(stream)  # the trainer's first next() asks for the slice
    finally:
        stream.close()


@pytest.mark.parametrize("value, on", [("1", True), ("0", False)])
def test_the_switch_values(monkeypatch, value, on):
    monkeypatch.setenv("FEEDLINE_TRAINER_SLICE", value)
    assert latency.asked() is on
    monkeypatch.delenv("FEEDLINE_TRAINER_SLICE")
    assert latency.asked() is True


def test_exact_sleeps_puts_the_timer_slack_back():
    import ctypes
    import sys
    if not sys.platform.startswith("linux"):
        pytest.skip("timer slack is Linux's")
    prctl = ctypes.CDLL(None).prctl
    before = prctl(30, 0, 0, 0, 0)
    with exact_sleeps():
        assert prctl(30, 0, 0, 0, 0) == 1
    assert prctl(30, 0, 0, 0, 0) == before
