"""The numba kernels a benchmark will run, compiled before any clock starts, in a process of its own.

feedline's CPU kernels are compiled at their first call and kept in numba's disk cache (``ops/_numba.py``); on a
new install the cache is empty, and the first process that reads a table compiles every kernel it runs (some
20 s on 2 cores). A benchmark that timed that process would report a new install's one-time compile, not what a
user's steady use gives. So before any clock starts, :func:`warm_kernels` runs, in a process of its own, the same
readers the benchmark will time (its own openers, with the same batch size and placement) over a sample of the
same data in the same format: the first :data:`SAMPLE_ROWS` rows of a TSV (plain or ``.gz``) or Parquet file,
written beside each other in a temporary folder; the data itself, a few batches an epoch, where it is a folder
or a pattern. Each reader runs :data:`EPOCHS` epochs, so that the table cache both writes and reads back.

The benchmark's timed processes then find every kernel in the cache and load it, as a user's later processes
do: the load stays inside the timing. :func:`feedline.benchmarks.numba_compiles.compiled_kernels` counts what a process compiled (numba's cache
misses of feedline's kernels), so that a benchmark reports any compile left inside its timing
(``kernels_compiled_in_timing``, 0 unless no cache folder is writable).
"""
from __future__ import annotations

import concurrent.futures
import gzip
import itertools
import multiprocessing
import os
import tempfile
import time
from typing import Callable, Sequence

from ..loader.cache_policy import CacheSettings
from ..loader.sources.text_to_columnar import convert
from ..loader.stream_order import DEFAULT_BUFFER_ROWS
from ..pipelines.criteo import criteo
from . import criteo_readers
from .numba_compiles import compile_timer, compiled_kernels, compiled_since

# More rows than the Loader keeps parsed (two shuffle buffers and a few chunks), so that its chunk cache evicts
# as on a large file; fewer where the data has fewer.
SAMPLE_ROWS = 3 * DEFAULT_BUFFER_ROWS
EPOCHS = 3
# Batches per epoch where the data is read itself (a folder or a pattern, of which no sample is made).
BOUNDED_BATCHES = 4
TIMEOUT_S = 900.0
READERS = ("loader_cache_on", "loader_cache_off", "feedline_tsv", "feedline_converted", "pyarrow_numpy")


def note(result: dict) -> str:
    """The report's sentence on the warm-up whose keys are in ``result``."""
    return (f"kernel warm-up: before any clock started, a process of its own ran the feedline readers this bench "
            f"times ({', '.join(result['kernel_warmup_readers'])}) over a sample of the data (of each of a mix's "
            f"tables: its first {SAMPLE_ROWS:,} rows in the same format, or a few batches of a folder), {EPOCHS} "
            f"epochs each, so that numba compiled any kernel missing from its disk cache: kernel_compile_s (the "
            f"seconds it compiled, "
            f"~0 where the cache held them all, as on every run after a new install's first), kernels_compiled, "
            f"kernel_warmup_s (that whole process); the timed processes load the compiled kernels from the cache "
            f"inside their timing, as a user's later processes do"
            + (", and kernels_compiled_in_timing counts any compile left inside it (0 unless numba has no writable "
               "cache folder)" if "kernels_compiled_in_timing" in result else
               " (the remote workers' compiles are not counted: compare first_batch_s with a warm run)"))


class InSample(Exception):
    """An error reading a sample, its message naming the file the sample was taken from."""


def warm_kernels(path: str | os.PathLike | Sequence[str | os.PathLike], readers: tuple[str, ...], *,
                 batch_size: int, table_size: int | None, placement: str = "cpu", last_batch: str = "partial",
                 timeout_s: float = TIMEOUT_S) -> dict:
    """Run ``readers`` (names of :data:`READERS`) over a sample of the Criteo data at ``path`` (or of each of a
    list of paths: a mix's tables) in a process of its own (``spawn``: the same interpreter, the same
    ``sys.path``, so the same package and numba cache), and wait for it. Returns ``kernel_compile_s`` (seconds
    the process spent compiling), ``kernels_compiled``, ``kernel_warmup_s`` (the process's whole time, start-up
    included) and ``kernel_warmup_readers``."""
    unknown = [r for r in readers if r not in READERS]
    if unknown or not readers:
        raise ValueError(f"readers must be some of {', '.join(READERS)}, got {readers!r}")
    paths = list(dict.fromkeys(os.fspath(p) for p in (path if isinstance(path, (list, tuple)) else [path])))
    if not paths:
        raise ValueError("path must be a path or a non-empty list of paths, got an empty list")
    job = {"paths": paths, "readers": tuple(readers), "batch_size": batch_size, "table_size": table_size,
           "placement": placement, "last_batch": last_batch}
    began = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            done = pool.submit(warm, job).result(timeout=timeout_s)
        except Exception as exc:
            hint = ("; its process died: if a script of yours runs the bench, put the script's top-level code under "
                    "`if __name__ == \"__main__\":` (the warm-up's spawned process imports the script again), or run "
                    "`feedline bench`" if isinstance(exc, concurrent.futures.process.BrokenProcessPool) else "")
            reason = str(exc) if isinstance(exc, InSample) else f"{type(exc).__name__}: {exc}"
            raise RuntimeError(f"the kernel warm-up (readers {', '.join(readers)} over a sample of "
                               f"{', '.join(map(repr, paths))}) failed: {reason}{hint}") from exc
    return {"kernel_compile_s": round(done["compile_s"], 3), "kernels_compiled": sum(done["compiled"].values()),
            "kernel_warmup_s": round(time.perf_counter() - began, 3), "kernel_warmup_readers": list(readers)}


def warmed_run(bench: Callable[[], dict], path, readers: tuple[str, ...], *, count_compiles: bool = True,
               **warm) -> dict:
    """``bench()``, a benchmark timed in this process, run after :func:`warm_kernels` (given ``path``,
    ``readers`` and ``warm``): its result with the warm-up's keys, its note and, where ``count_compiles``,
    ``kernels_compiled_in_timing`` (what this process compiled inside ``bench``)."""
    warmed = warm_kernels(path, readers, **warm)
    before = compiled_kernels()
    result = bench()
    result.update(warmed)
    if count_compiles:
        result.update(compiled_since(before))
    result.setdefault("notes", []).append(note(result))
    return result


def warm(job: dict) -> dict:
    """The warm-up process's work (see :func:`warm_kernels`): ``compile_s`` and ``compiled``."""
    from numba.core import event

    timer = compile_timer()

    event.register("numba:compile", timer)
    try:
        with tempfile.TemporaryDirectory(prefix="feedline-kernel-warmup-") as work:
            for number, path in enumerate(job["paths"]):
                folder = os.path.join(work, str(number))
                sample = sample_of(path, os.path.join(folder, "sample"), SAMPLE_ROWS)
                os.makedirs(folder, exist_ok=True)
                try:
                    for reader in job["readers"]:
                        _run(reader, sample or path, None if sample else BOUNDED_BATCHES, job, folder)
                except Exception as exc:
                    if sample is None:
                        raise
                    # the sample's rows are the file's first, at the same lines: name the user's file
                    raise InSample(f"{type(exc).__name__}: {str(exc).replace(sample, path)}") from None
    finally:
        event.unregister("numba:compile", timer)
    return {"compile_s": timer.seconds, "compiled": compiled_kernels()}


def sample_of(path: str, folder: str, rows: int) -> str | None:
    """The first ``rows`` rows of the file at ``path`` written, in its format and under its name, into
    ``folder`` (created); the path of that sample, or None where ``path`` is not one file."""
    if not os.path.isfile(path):
        return None
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, os.path.basename(path))
    lower = path.lower()
    if lower.endswith((".parquet", ".pq")):
        import pyarrow as pa
        import pyarrow.parquet as pq

        source = pq.ParquetFile(path)
        group_rows = source.metadata.row_group(0).num_rows if source.metadata.num_row_groups else rows
        head = pa.Table.from_batches(itertools.islice(source.iter_batches(batch_size=rows), 1),
                                     schema=source.schema_arrow)
        pq.write_table(head, out, row_group_size=max(group_rows, 1))
    elif lower.endswith(".gz"):
        with gzip.open(path, "rb") as src, gzip.open(out, "wb") as dst:
            dst.writelines(itertools.islice(src, rows))
    else:
        with open(path, "rb") as src, open(out, "wb") as dst:
            dst.writelines(itertools.islice(src, rows))
    return out


def _run(reader: str, data: str, batches: int | None, job: dict, work: str) -> None:
    size, table = job["batch_size"], job["table_size"]
    if reader.startswith("loader_"):
        mode = reader.rpartition("_")[2]
        folder = tempfile.mkdtemp(prefix="cache-", dir=work)
        loader = criteo_readers.open_loader(data, size, job["placement"], table_size=table,
                                            cache=CacheSettings(mode=mode, directory=folder),
                                            last_batch=job["last_batch"])
        _epochs(lambda: loader, loader.close, EPOCHS, batches)
    elif reader == "pyarrow_numpy":
        from . import pyarrow_baseline  # (pyarrow imported only where a bench compares with it)

        _epochs(pyarrow_baseline.open_numpy(data, size, table).make, None, 1, batches)
    else:
        if reader == "feedline_converted":  # what `feedline convert criteo` runs
            folder = os.path.join(work, "converted")
            convert(criteo(data, format="tsv", on_error="raise").source, folder)
            data = folder
        opened = criteo_readers.open_feedline(data, size, table)
        _epochs(opened.make, opened.close, EPOCHS, batches)


def _epochs(make, close, epochs: int, batches: int | None) -> None:
    try:
        for _ in range(epochs):
            epoch = iter(make())
            for _ in itertools.islice(epoch, batches):
                pass
            getattr(epoch, "close", lambda: None)()
    finally:
        if close is not None:
            close()
