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
    """The policy for bad samples, said in one place: where the pipeline is defined or on the Loader (both only
    if they agree). A table's files carry their own (``criteo(..., on_error=)``, ``TabularFiles(..., on_error=)``,
    ``"raise"`` unless given there), since the source checks rows as it reads them."""
    files = getattr(pipeline.source, "on_error", None)
    defined = f"given where pipeline {pipeline.name!r} was defined (image.train, image.val or image.pipeline)"
    tables = f"of the files of pipeline {pipeline.name!r} ('raise' unless given where they are declared)"
    declared = [(v, place) for v, place in ((pipeline.on_error, defined), (files, tables)) if v is not None]
    if len({v for v, _ in declared}) > 1:
        raise ValueError(f"on_error={declared[0][0].value!r} {declared[0][1]} differs from "
                         f"on_error={declared[1][0].value!r} {declared[1][1]}")
    if on_error is None:
        return declared[0][0] if declared else OnError.RAISE
    chosen = parse_on_error(on_error)
    if declared and declared[0][0] is not chosen:
        value, place = declared[0]
        where = (f"a table's rows are checked as its files are read, so give it where they are declared: "
                 f"criteo(..., on_error={chosen.value!r}) or TabularFiles(..., on_error={chosen.value!r})"
                 if files is not None else "give it in one place, there or to the Loader")
        raise ValueError(f"Loader(on_error={chosen.value!r}) differs from on_error={value.value!r} {place}; {where}")
    return chosen
