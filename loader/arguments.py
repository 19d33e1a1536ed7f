"""The Loader's plain arguments, checked at construction: each error names the argument, what it takes and
what came."""
from __future__ import annotations

from ..pipelines.spec import PipelineSpec
from ..pipelines.tabular import TabularFiles
from .devices import available_cores
from .errors import OnError, parse_on_error
from .stream_order import DEFAULT_BUFFER_ROWS


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def work_counts(num_threads: int | None, prefetch: int, max_pixels: int) -> int:
    """``num_threads`` (default: the cores this process may use), after checking all three."""
    if num_threads is None:
        num_threads = available_cores()
    if not _integer(num_threads) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive integer, got {num_threads!r}")
    if not _integer(prefetch) or not 1 <= prefetch <= 16:
        raise ValueError(f"prefetch must be an integer in [1, 16], got {prefetch!r}")
    if not _integer(max_pixels) or max_pixels < 1:
        raise ValueError(f"max_pixels must be a positive integer, got {max_pixels!r}")
    return num_threads


def shuffle_buffer_rows(pipeline: PipelineSpec, shuffle_buffer: int | None) -> int | None:
    """Rows per shuffle buffer-full for a streamed table (default ``DEFAULT_BUFFER_ROWS``); None for images."""
    streamed = isinstance(pipeline.source, TabularFiles)
    if shuffle_buffer is not None and not streamed:
        raise ValueError("shuffle_buffer applies to tabular sources, which are streamed; image samples are "
                         "shuffled by an exact permutation")
    if shuffle_buffer is not None and (not _integer(shuffle_buffer) or shuffle_buffer < 1):
        raise ValueError(f"shuffle_buffer must be a positive number of rows, got {shuffle_buffer!r}")
    return (shuffle_buffer or DEFAULT_BUFFER_ROWS) if streamed else None


def on_error_of(pipeline: PipelineSpec, on_error: OnError | str | None) -> OnError:
    """The policy for bad samples: the Loader's, which must agree with one the pipeline was defined with."""
    declared = getattr(pipeline.source, "on_error", None)  # tabular sources validate rows when opened
    if on_error is None:
        return declared or OnError.RAISE
    chosen = parse_on_error(on_error)
    if declared is not None and declared is not chosen:
        raise ValueError(f"on_error={chosen.value!r} differs from the {declared.value!r} that pipeline "
                         f"{pipeline.name!r} was defined with; set it where the pipeline is defined "
                         f"(e.g. criteo(..., on_error={chosen.value!r}))")
    return chosen
