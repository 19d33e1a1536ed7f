"""SingleFlight: one thread loads a key while the others wait for its result or its error; what the owner keeps is
kept under the lock before any waiter wakes; with share_error=False a failure reaches only its own caller."""
from __future__ import annotations

import threading

import pytest

from feedline.loader.sources.single_flight import SingleFlight


def start_waiter(flights, lock, key, got):
    """A thread that claims ``key`` (already the owner's) and records what waiting on it gives."""
    claimed = threading.Event()

    def wait():
        with lock:
            flight, mine = flights.claim(key)
        claimed.set()
        assert not mine
        try:
            got.append(("value", flight.wait()))
        except OSError as e:
            got.append(("error", str(e)))

    thread = threading.Thread(target=wait)
    thread.start()
    claimed.wait()
    return thread


def test_waiters_get_the_owners_value_kept_under_the_lock_before_they_wake():
    lock = threading.Lock()
    flights = SingleFlight(lock)
    kept, got, loads = {}, [], []
    with lock:
        flight, mine = flights.claim(7)
    assert mine and 7 in flights
    waiters = [start_waiter(flights, lock, 7, got) for _ in range(3)]

    def keep(value):
        assert lock.locked() and not got  # under the lock, nobody woken yet
        kept[7] = value

    assert flights.run(7, flight, lambda: loads.append(1) or "chunk 7", keep=keep) == "chunk 7"
    for t in waiters:
        t.join()
    assert got == [("value", "chunk 7")] * 3 and kept == {7: "chunk 7"} and loads == [1]
    assert 7 not in flights
    with lock:
        assert flights.claim(7)[1]  # ended: the next claim is a new load


@pytest.mark.parametrize("share_error", [True, False])
def test_a_failure_reaches_the_waiters_only_when_shared(share_error):
    lock = threading.Lock()
    flights = SingleFlight(lock)
    kept, got = [], []
    with lock:
        flight, _ = flights.claim("a")
    waiters = [start_waiter(flights, lock, "a", got) for _ in range(2)]

    def fail():
        raise OSError("chunk a could not be read")

    with pytest.raises(OSError, match="chunk a could not be read"):
        flights.run("a", flight, fail, keep=kept.append, share_error=share_error)
    for t in waiters:
        t.join()
    expected = ("error", "chunk a could not be read") if share_error else ("value", None)
    assert got == [expected] * 2 and kept == [] and "a" not in flights


def test_a_load_builds_no_condition(monkeypatch):
    """(Per chunk loaded: a claim and a run take a lock, not a threading.Event with its Condition.)"""
    built = []
    real = threading.Condition.__init__
    monkeypatch.setattr(threading.Condition, "__init__", lambda self, *a: built.append(1) or real(self, *a))
    lock = threading.Lock()
    flights = SingleFlight(lock)
    with lock:
        flight, mine = flights.claim(3)
    assert mine and flights.run(3, flight, lambda: "chunk 3") == "chunk 3" and flight.wait() == "chunk 3"
    assert built == []


def test_a_key_is_in_flight_from_its_claim_until_its_load_ends_and_asking_runs_no_python():
    """``key in flights`` is asked for every chunk a plan warms (chunk_cache.load_missing): a dict's own test."""
    import sys

    lock = threading.Lock()
    flights = SingleFlight(lock)
    calls = []

    def count(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_name)

    with lock:
        flight, mine = flights.claim("a")
        sys.setprofile(count)
        try:
            asked = ("a" in flights, "b" in flights)
        finally:
            sys.setprofile(None)
    assert mine and asked == (True, False) and calls == []
    seen = []
    assert flights.run("a", flight, lambda: seen.append("a" in flights) or 7) == 7
    assert seen == [True] and "a" not in flights
