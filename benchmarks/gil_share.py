"""The share of wall time a process holds the GIL, sampled from outside with py-spy (``--gil``: a sample is
kept only when some thread of the process holds the GIL), for ``feedline bench ... --gil-profile DIR``.

py-spy attaches with ptrace: it needs the same user and a kernel that allows it (``kernel.yama.ptrace_scope``
0, or CAP_SYS_PTRACE; containers may forbid it). By hand, while a benchmark runs:
``py-spy record --gil --idle --nonblocking -r 100 -d 5 --format raw -o gil.txt -p PID``; the GIL share is the
sum of the counts in ``gil.txt`` over ``100 * 5``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

RATE = 100  # samples per second
# Thread kinds by the names the threads were started with (py-spy ``-t`` puts ``thread (ID): NAME`` first in a
# stack): feedline's batch thread (``loader.background``) and feature workers (``runners.plan_threads``).
THREAD_KINDS = (("feedline-batches", "batch"), ("feedline-features", "workers"), ("MainThread", "main"))


def py_spy() -> str:
    """The py-spy executable beside this Python, else on PATH; a ``ValueError`` saying how to get it."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which("py-spy")
    if found is None:
        raise ValueError("--gil-profile samples the GIL with py-spy, which is not installed (pip install py-spy)")
    return found


def record_gil(pid: int, seconds: int, out: str | os.PathLike, rate: int = RATE) -> dict:
    """Sample process ``pid`` for ``seconds`` without pausing it; the raw stacks that held the GIL go to ``out``
    (one ``stack count`` line each: a flame graph's input). Returns ``gil_share`` (GIL samples / samples taken;
    an estimate, as py-spy reads the process while it runs), ``gil_samples`` and ``gil_share_by_thread`` (the
    share per thread kind, ``thread_kind``'s)."""
    argv = [py_spy(), "record", "--gil", "--idle", "--nonblocking", "--threads", "-r", str(rate), "-d",
            str(seconds), "--format", "raw", "-o", os.fspath(out), "-p", str(pid)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"py-spy could not sample process {pid} (it attaches with ptrace, which this machine "
                           f"may forbid): {done.stderr.strip()[-500:]}")
    by_thread = gil_samples_by_thread(out)
    samples = sum(by_thread.values())
    return {"gil_share": samples / (rate * seconds), "gil_samples": samples,
            "gil_share_by_thread": {kind: n / (rate * seconds) for kind, n in sorted(by_thread.items())}}


def gil_samples(raw: str | os.PathLike) -> int:
    """The samples in a py-spy raw file: the sum of the count that ends each line."""
    return sum(gil_samples_by_thread(raw).values())


def gil_samples_by_thread(raw: str | os.PathLike) -> Counter:
    """The samples in a py-spy raw file per thread kind (``thread_kind`` of each stack's first frame)."""
    counts: Counter = Counter()
    for line in Path(raw).read_text().splitlines():
        if line.strip():
            stack, count = line.rsplit(" ", 1)
            counts[thread_kind(stack.split(";", 1)[0])] += int(count)
    return counts


def thread_kind(frame: str) -> str:
    """``batch``, ``workers`` or ``main`` for a ``thread (ID): NAME`` frame of one of those threads, else ``other``
    (another thread, or a stack recorded without thread frames)."""
    if not frame.startswith("thread ("):
        return "other"
    name = frame.partition("): ")[2]
    return next((kind for prefix, kind in THREAD_KINDS if name.startswith(prefix)), "other")


def gil_keys(side: str, gil: dict, rows_per_s: float, batch_size: int) -> dict:
    """A bench's keys for ``side`` from ``record_gil``'s answer: ``SIDE_gil_share``, the share per thread kind, and
    the GIL's milliseconds per batch at ``rows_per_s`` (in all and per thread kind: a faster loader holds the
    same GIL per batch in a larger share of its time, so the share alone hides what a change saves)."""
    per_batch_ms = 1e3 * batch_size / rows_per_s if rows_per_s > 0 else float("nan")
    by_thread = gil.get("gil_share_by_thread", {})
    return {f"{side}_gil_share": gil["gil_share"],
            f"{side}_gil_share_by_thread": {kind: round(share, 4) for kind, share in by_thread.items()},
            f"{side}_gil_ms_per_batch": gil["gil_share"] * per_batch_ms,
            f"{side}_gil_ms_per_batch_by_thread": {kind: round(share * per_batch_ms, 4)
                                                   for kind, share in by_thread.items()}}
