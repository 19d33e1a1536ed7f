"""A process's own peak memory, and commands run in a process of their own that report theirs.

Only the standard library is imported here: a command run through :func:`run_module` starts from a bare
interpreter, so its peak is its own work's.
"""
from __future__ import annotations

import json
import os
import resource
import runpy
import subprocess
import sys
import time

MODULE = "feedline.benchmarks.peak_memory"


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB: ``VmHWM``, which starts again at ``exec``
    (``ru_maxrss`` keeps the peak from before it, which for a child started by ``fork`` or ``vfork`` is its
    parent's)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_module(module: str, args: list[str], report: str | os.PathLike, *, cwd: str | None = None) -> dict:
    """Run ``python -m module args...`` (a command that writes a JSON summary to ``report``) in a process of its
    own and return that summary with ``process_s`` (the whole process, interpreter start and imports included)
    and ``peak_rss_mb`` (its own peak: see :func:`peak_rss_mb`). A failing command is a ``RuntimeError`` with its
    error output."""
    peak_file = f"{os.fspath(report)}.peak"
    argv = [sys.executable, "-m", MODULE, peak_file, module, *map(str, args)]
    began = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd)
    process_s = time.perf_counter() - began
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-15:]
        raise RuntimeError(f"python -m {module} {' '.join(map(str, args[:4]))} ... failed (exit status "
                           f"{done.returncode}):\n" + "\n".join(tail))
    with open(report) as f:
        summary = json.load(f)
    with open(peak_file) as f:
        peak = float(f.read())
    os.remove(peak_file)
    return {**summary, "process_s": process_s, "peak_rss_mb": peak}


def _run_measured(argv: list[str]) -> int:
    """``PEAK_FILE MODULE [ARGS...]``: run MODULE as ``__main__`` here, then write this process's peak memory
    to PEAK_FILE."""
    peak_file, module, *args = argv
    sys.argv = [module, *args]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    with open(peak_file, "w") as f:
        f.write(f"{peak_rss_mb()}\n")
    return code


if __name__ == "__main__":
    sys.exit(_run_measured(sys.argv[1:]))
