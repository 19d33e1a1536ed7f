"""Where each stage runs: a placement request resolved to a cut, or chosen by measuring (scheduler, monitors,
profiler, auto placement, the plan report)."""
from .resolve import resolve

__all__ = ["resolve"]
