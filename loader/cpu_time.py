"""CPU seconds this process has used: user and system time of all its threads (``getrusage``), as the placement
profiler, the image runner's stage profile and the benchmarks read it."""
from __future__ import annotations

import resource


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
