"""A Loader shared beyond its own thread: copied into a child by fork() after it started (a clear error there,
never the parent's prefetched batches), and saved from another thread while the trainer iterates (never half
an update)."""
import json
import os
import select
import signal
import sys
import threading
import time

import pytest

from feedline.loader import Loader
from feedline.loader.background import BackgroundStream
from feedline.loader.cursor import Cursor
from feedline.pipelines import image


def wait_for(condition, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)


def in_a_forked_child(work, timeout: float = 60.0) -> dict:
    """``work()``'s dict, computed in a child made by os.fork() and sent back as JSON."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            os.write(write, json.dumps(work()).encode())
        finally:
            os._exit(0)
    os.close(write)
    ready, _, _ = select.select([read], [], [], timeout)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child hung")
    data = b""
    while chunk := os.read(read, 1 << 16):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(data)


def outcome(call):
    try:
        return ["value", call()]
    except Exception as e:  # what the child met, to be checked in the parent
        return [type(e).__name__, str(e)]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_forked_child_gets_a_clear_error_not_the_parents_batches(image_dir):
    loader = Loader(image.val(image_dir, size=32), batch_size=4, placement="cpu", prefetch=2)
    it = iter(loader)
    first = next(it)["index"].tolist()
    wait_for(lambda: loader.background.ready == 2, "the parent has two batches ready")

    def child():
        return {"old": outcome(lambda: next(it)["index"].tolist()),
                "new": outcome(lambda: next(iter(loader))["index"].tolist()),
                "state": outcome(lambda: loader.state_dict()["position"]),
                "close": outcome(loader.close)}

    seen = in_a_forked_child(child)
    for what in ("old", "new"):
        kind, message = seen[what]
        assert kind == "ForkedLoaderError", seen
        assert f"started iterating in process {os.getpid()}" in message and "fork()" in message
        assert "Build the Loader in the process that iterates it" in message and "state_dict" in message
    assert seen["state"] == ["value", 1] and seen["close"] == ["value", None]
    # The parent goes on, unharmed, from its next batch.
    assert first + [i for b in it for i in b["index"].tolist()] == list(range(37))
    loader.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_batch_stream_refuses_a_forked_child_open_or_closed():
    streams = {"open": BackgroundStream(lambda: iter(range(100)), 2), "closed": BackgroundStream(lambda: iter([]), 2)}
    assert next(streams["open"]) == 0
    streams["closed"].close()
    wait_for(lambda: streams["open"].ready == 2, "two items are ready")
    seen = in_a_forked_child(lambda: {name: outcome(lambda: next(stream)) for name, stream in streams.items()})
    for name in streams:
        kind, message = seen[name]
        assert kind == "RuntimeError" and f"runs in process {os.getpid()}" in message, seen
        assert "was forked from it and cannot take its batches" in message
    assert next(streams["open"]) == 1  # the parent's stream goes on
    streams["open"].close()


def test_taking_a_ready_batch_asks_the_system_nothing_about_forks(image_dir):
    """The fork checks of a batch read marks set by fork hooks: no os.getpid(), a system call, per batch."""
    loader = Loader(image.val(image_dir, size=32), batch_size=4, placement="cpu", prefetch=2)
    it = iter(loader)
    next(it)
    wait_for(lambda: loader.background.ready == 2, "two batches are ready")
    called = []
    sys.setprofile(lambda frame, event, arg: called.append(arg) if event == "c_call" else None)
    try:
        next(it)
    finally:
        sys.setprofile(None)
    assert os.getpid not in called and len(called) > 1
    loader.close()


def test_state_dict_from_another_thread_never_sees_half_an_update(image_dir, monkeypatch):
    """The trainer's thread is held right after the first field of its next cursor update is written; the other
    thread's state_dict must see the position before or after that batch, never a mix of the two."""
    loader = Loader(image.val(image_dir, size=32), batch_size=4, placement="cpu")
    it = iter(loader)
    next(it)
    trainer, halfway, read, saved = threading.current_thread(), threading.Event(), threading.Event(), {}
    armed = [True]

    def held_after_first_write(self, name, value):
        object.__setattr__(self, name, value)
        if armed[0] and threading.current_thread() is trainer:
            armed[0] = False
            halfway.set()
            read.wait(timeout=1.0)  # the other thread reads now, unless the update keeps it out

    monkeypatch.setattr(Cursor, "__setattr__", held_after_first_write)

    def save():
        halfway.wait(timeout=60)
        saved.update(loader.state_dict())
        read.set()

    other = threading.Thread(target=save)
    other.start()
    next(it)
    other.join(timeout=60)
    monkeypatch.undo()
    assert halfway.is_set() and not other.is_alive()
    assert (saved["epoch"], saved["position"], saved["cursor"]) in {(0, 1, 4), (0, 2, 8)}, saved
    resumed = Loader(image.val(image_dir, size=32), batch_size=4, placement="cpu")
    resumed.load_state_dict(saved)
    assert len(list(resumed)) == len(loader) - saved["position"]
    loader.close()
