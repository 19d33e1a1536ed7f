"""One contender of a benchmark in a process of its own, driven turn by turn from the benchmark's process.

Loaders keep memory (TorchRec holds the whole dataset, feedline its chunk cache), so each side's peak resident
memory is only its own when it runs alone in a process; its threads then also never compete with another
side's for the GIL. The benchmark starts every side (imports are untimed), then asks each in turn for its
first epoch and for alternating rounds (:class:`SideProcess`). A side is named by an *opener*,
``"module:function"``, called in the child with keyword arguments; it returns :class:`Opened`.

Conversions run as commands of their own (:func:`feedline.benchmarks.peak_memory.run_module`).
"""
from __future__ import annotations

import dataclasses
import importlib
import multiprocessing
import os
import time
import traceback
from typing import Any, Callable, Iterable

from ..loader.epochs import batch_size_of, endless
from .numba_compiles import compiled_kernels, compiled_since
from .peak_memory import peak_rss_mb
from .trainer import run_trainer

START_TIMEOUT_S = 300.0  # imports (torch, TorchRec) on a busy machine
POLL_S = 1.0


@dataclasses.dataclass
class Opened:
    """What an opener returns: ``make()`` gives one epoch's batches (each a tensor, array, table or a tuple,
    list or dict whose first element counts the rows); ``readahead``: batches the side makes ahead of its
    consumer while it waits (0 when it makes each batch inside ``next()``); ``close()`` releases it; ``facts``:
    what the benchmark's report needs to know about it (plain values)."""

    make: Callable[[], Iterable]
    readahead: int = 0
    close: Callable[[], None] = lambda: None
    facts: dict = dataclasses.field(default_factory=dict)


def rss_mb() -> float:
    """This process's resident memory now, in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def _resolve(opener: str) -> Callable[..., Opened]:
    module, _, name = opener.partition(":")
    if not module or not name:
        raise ValueError(f"opener must be 'module:function', got {opener!r}")
    return getattr(importlib.import_module(module), name)


def _serve(conn, opener: str, kwargs: dict, imports: tuple[str, ...]) -> None:
    """The child: import ``imports`` and the opener (untimed), report ready, then answer commands until
    ``close``."""
    try:
        for module in imports:
            importlib.import_module(module)
        open_side = _resolve(opener)
        conn.send({"ready": True, "pid": os.getpid(), "rss_after_imports_mb": rss_mb()})
        compiled = compiled_kernels()  # (imports compile nothing; everything from here on is timed)
        opened, stream = None, None
        while True:
            command, args = conn.recv()
            if command == "first_epoch":
                opened, result = _first_epoch(open_side, kwargs)
                stream = endless(opened.make)
                conn.send(result)
            elif command == "round":
                conn.send(run_trainer(stream, args["batches"], args.get("step_s", 0.0), warmup=args["untimed"]))
            elif command == "busy":
                conn.send(_busy(stream, args["seconds"]))
            elif command == "close":
                if stream is not None:
                    stream.close()
                if opened is not None:
                    opened.close()
                conn.send({"peak_rss_mb": peak_rss_mb(), "rss_at_close_mb": rss_mb(), **compiled_since(compiled)})
                return
            else:
                raise ValueError(f"unknown command {command!r}")
    except BaseException as exc:  # the benchmark's process reports it, naming the side
        conn.send({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})


def _first_epoch(open_side: Callable[..., Opened], kwargs: dict) -> tuple[Opened, dict]:
    """Open the side and take one whole epoch: ``open_s`` (the opener's own time), ``first_batch_s`` and
    ``seconds`` (both from before opening), ``rows`` and ``batches``."""
    began = time.perf_counter()
    opened = open_side(**kwargs)
    open_s = time.perf_counter() - began
    epoch = iter(opened.make())
    rows, batches, first_batch_s = 0, 0, None
    for batch in epoch:
        rows += batch_size_of(batch)
        batches += 1
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - began
    seconds = time.perf_counter() - began
    if batches == 0:
        raise ValueError("the side's first epoch yielded no batches")
    return opened, {"open_s": open_s, "first_batch_s": first_batch_s, "seconds": seconds, "rows": rows,
                    "batches": batches, "readahead": opened.readahead, "facts": opened.facts,
                    "peak_rss_after_first_epoch_mb": peak_rss_mb()}


def _busy(stream, seconds: float) -> dict:
    """Take batches for ``seconds`` (while the GIL is sampled from outside)."""
    rows, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        rows += batch_size_of(next(stream))
    return {"rows": rows, "seconds": time.perf_counter() - began}


class SideProcess:
    """A side in its own process (``spawn``: the parent may hold threads that make ``fork`` unsafe)."""

    def __init__(self, name: str, opener: str, kwargs: dict[str, Any], imports: tuple[str, ...] = ()):
        self.name = name
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, opener, kwargs, tuple(imports)),
                                       name=f"bench-{name}", daemon=True)
        self.process.start()
        child.close()
        self.ready: dict | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> dict:
        self.ready = self._receive(timeout_s)
        return self.ready

    def first_epoch(self) -> dict:
        return self._ask("first_epoch", {})

    def round(self, batches: int, untimed: int, step_s: float = 0.0) -> dict:
        return self._ask("round", {"batches": batches, "untimed": untimed, "step_s": step_s})

    def busy(self, seconds: float) -> None:
        """Start taking batches for ``seconds``; :meth:`busy_done` collects the answer."""
        self._conn.send(("busy", {"seconds": seconds}))

    def busy_done(self) -> dict:
        return self._receive(None)

    def close(self) -> dict:
        result = self._ask("close", {})
        self.process.join(timeout=30)
        return result

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=10)

    def _ask(self, command: str, args: dict) -> dict:
        self._conn.send((command, args))
        return self._receive(None)

    def _receive(self, timeout_s: float | None) -> dict:
        waited = 0.0
        while not self._conn.poll(POLL_S):
            waited += POLL_S
            if not self.process.is_alive():
                raise RuntimeError(f"the {self.name} side's process ended (exit code {self.process.exitcode}) "
                                   f"without an answer")
            if timeout_s is not None and waited >= timeout_s:
                raise RuntimeError(f"the {self.name} side's process did not start within {timeout_s:.0f} s")
        answer = self._conn.recv()
        if "error" in answer:
            raise RuntimeError(f"the {self.name} side failed: {answer['error']}\n{answer['traceback']}")
        return answer
