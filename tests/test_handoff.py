"""The batch thread's hand-off to the trainer: the trainer's ``next()`` wakes the batch thread only when it takes
the last batch ready; otherwise the batch thread, waiting for room, finds it on its own. Order, bound and
stopping as before."""
import threading

from feedline.loader.background import _Handoff


def counting_rings(handoff):
    rings = []
    ring = handoff._emptied.ring
    handoff._emptied.ring = lambda: (rings.append(1), ring())
    return rings


def giver(handoff, items, stop):
    done = []
    thread = threading.Thread(target=lambda: done.extend(handoff.put(i, stop) for i in items), daemon=True)
    thread.start()
    return thread, done


def wait_until(condition):
    event = threading.Event()
    while not condition():
        event.wait(0.001)


def test_taking_with_batches_left_wakes_nobody_and_the_giver_still_finds_room():
    handoff = _Handoff(2)
    rings = counting_rings(handoff)
    stop = threading.Event()
    thread, done = giver(handoff, range(6), stop)
    wait_until(lambda: handoff._giver_waits)  # full: the giver waits for room
    got = [handoff.get(timeout=60)]  # one batch left behind: no ring
    assert rings == []
    wait_until(lambda: handoff.qsize() == 2)  # the giver looked again and appended on its own
    while len(got) < 6:
        got.append(handoff.get(timeout=60))
        assert handoff.qsize() <= 2
    thread.join(60)
    assert got == list(range(6)) and done == [True] * 6


def test_taking_the_last_batch_rings_a_waiting_giver():
    handoff = _Handoff(1)
    rings = counting_rings(handoff)
    stop = threading.Event()
    thread, done = giver(handoff, range(2), stop)
    wait_until(lambda: handoff._giver_waits)
    assert handoff.get(timeout=60) == 0 and rings == [1]
    assert handoff.get(timeout=60) == 1
    thread.join(60)
    assert done == [True, True]


def test_a_stopped_giver_appends_nothing_more():
    handoff = _Handoff(1)
    stop = threading.Event()
    thread, done = giver(handoff, range(3), stop)
    wait_until(lambda: handoff._giver_waits)
    stop.set()
    thread.join(60)
    assert done == [True, False, False] and handoff.get(timeout=60) == 0 and handoff.empty()
