"""Where each stage runs: one controller of every placement decision (``controller``), a placement request
resolved to a cut, or chosen by measuring (scheduler and its model, monitors, profiler, auto placement, remote
workers' decision, the report)."""
from .resolve import resolve, uses_gpu

__all__ = ["resolve", "uses_gpu"]
