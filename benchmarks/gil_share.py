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
from pathlib import Path

RATE = 100  # samples per second


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
    an estimate, as py-spy reads the process while it runs) and ``gil_samples``."""
    argv = [py_spy(), "record", "--gil", "--idle", "--nonblocking", "-r", str(rate), "-d", str(seconds),
            "--format", "raw", "-o", os.fspath(out), "-p", str(pid)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"py-spy could not sample process {pid} (it attaches with ptrace, which this machine "
                           f"may forbid): {done.stderr.strip()[-500:]}")
    samples = gil_samples(out)
    return {"gil_share": samples / (rate * seconds), "gil_samples": samples}


def gil_samples(raw: str | os.PathLike) -> int:
    """The samples in a py-spy raw file: the sum of the count that ends each line."""
    total = 0
    for line in Path(raw).read_text().splitlines():
        if line.strip():
            total += int(line.rsplit(" ", 1)[1])
    return total
