"""Running pipelines: the Loader, its sources, runners and placement (the scheduler)."""
from .errors import DataError, PlacementError
from .loader import Loader
from .runners.remote import RayWorkers
from .sampler import LastBatch

__all__ = ["Loader", "LastBatch", "RayWorkers", "DataError", "PlacementError"]
