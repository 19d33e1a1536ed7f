"""Running pipelines: the Loader, placement, the scheduler and the CLI."""
from .errors import DataError, PlacementError
from .loader import Loader
from .sampler import LastBatch

__all__ = ["Loader", "LastBatch", "DataError", "PlacementError"]
