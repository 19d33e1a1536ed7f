"""The Loader's plain arguments, checked at construction: each error names the argument, what it takes and
what came."""
from __future__ import annotations

from ..pipelines.spec import PipelineSpec
from ..pipelines.tabular import TabularFiles
from ..pipelines.validate import int_in, positive_int
from .cache_policy import CacheSettings, cache_settings
from .devices import available_cores
from .errors import OnError, parse_on_error
from .stream_order import DEFAULT_BUFFER_ROWS


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def work_counts(num_threads: int | None, prefetch: int, max_pixels: int) -> tuple[int, int, int]:
    """``(num_threads, prefetch, max_pixels)`` checked, ``num_threads`` defaulting to the cores this process may
    use."""
    num_threads = positive_int("num_threads", available_cores() if num_threads is None else num_threads)
    prefetch = int_in("prefetch", prefetch, 1, 16)
    max_pixels = positive_int("max_pixels", max_pixels)
    return num_threads, prefetch, max_pixels


def batch_pixels(max_batch_pixels: int | None, max_pixels: int) -> int | None:
    """``max_batch_pixels``: None (the runner's default), or at least ``max_pixels``."""
    if max_batch_pixels is not None and (not _integer(max_batch_pixels) or max_batch_pixels < max_pixels):
        raise ValueError(f"max_batch_pixels must be an integer of at least max_pixels ({max_pixels}), so that "
                         f"one image of max_pixels fits a batch; got {max_batch_pixels!r}")
    return max_batch_pixels


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


def cache_of(pipeline: PipelineSpec, cache: object) -> CacheSettings:
    """The ``cache`` argument checked: "auto", "on", "off" or a ``CacheSettings``; a cap on decoded images
    only for an image pipeline."""
    settings = cache_settings(cache)
    if settings.decoded_max_side is not None and isinstance(pipeline.source, TabularFiles):
        raise ValueError(f"cache=CacheSettings(decoded_max_side={settings.decoded_max_side}) caps decoded images; "
                         f"pipeline {pipeline.name!r} reads tables")
    return settings
