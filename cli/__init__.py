"""The ``feedline`` command (make-data, convert, bench, plan): above the library and the benchmarks, which never
import it."""
from .command import main

__all__ = ["main"]
