"""Criteo rows per second: feedline end to end (torch tensors in hand) against the preprocessing a user writes
today in the style of the DLRM reference (pandas ``read_csv``, then a Python ``int(x, 16) % n`` per
categorical value and ``log1p`` of the clipped dense columns), producing the same outputs.

Both sides deliver, per batch: float32 ``label`` [B], float32 ``dense`` [B, 13], and the 26 categorical ids in
key-major ``values``/``lengths``/``offsets`` form. The baseline maps ids with ``% n`` instead of MurmurHash3,
which only flatters it (a Python hash per value would cost more).

Both sides are counted the same way. End to end (the headline ``speedup``, one whole epoch): from nothing to the
last batch in hand, feedline's opening (which indexes the files) and the baseline's ``read_csv``
included. Steady (``steady_speedup``): from the rows parsed in memory (feedline's files open, the baseline's
``read_csv`` done) to the last batch in hand. With ``trainer_step_ms`` both are also measured in alternating
rounds with and without a simulated trainer (:mod:`feedline.benchmarks.trainer`); there the baseline converts
each batch's rows as it is asked for it, on the trainer's thread, as a training loop written that way does.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

import numpy as np
import torch

from ..loader.cache_policy import CacheSettings
from ..loader import latency
from ..loader.epochs import batch_size_of, endless, measure_loader
from ..loader.loader import Loader
from ..pipelines.criteo import CATEGORICAL_NAMES, DENSE_NAMES
from . import kernel_warmup
from .criteo_readers import TABLE_SIZE, open_loader
from .numba_compiles import compiled_kernels, compiled_since
from .trainer import (CEILING_NOTE, SPLIT_NOTE, ceiling_summary, check_trainer_step, cuda_sync, paired_rounds,
                      trainer_summary)

WARMUP_BATCHES = 2
# Before each round of the trainer comparison: feedline's threads refill its read-ahead during the pause, not
# during the baseline's round (the baseline makes nothing ahead).
SETTLE_S = 0.5
# Rounds of the trainer comparison last about this long (batches per round from each side's untimed first round):
# long enough to be steady, short enough that both sides' rounds interleave closely.
ROUND_S = 0.75
# The Loader keeps parsed chunks of a TSV for two shuffle buffers (plus a few chunks): a file of no more rows
# than this is parsed only in its first epoch.
CACHED_BUFFERS = 2


def cached_note(side: str, rows: int, shuffle_buffer: int | None) -> str | None:
    """A sentence for the report when a TSV of ``rows`` rows stays parsed in the Loader's chunk cache after the
    first epoch (``shuffle_buffer``: the Loader's; None for a source that is not streamed), else None."""
    if shuffle_buffer is None or rows > CACHED_BUFFERS * shuffle_buffer:
        return None
    return (f"{side}: the file's {rows:,} rows fit in the Loader's chunk cache ({CACHED_BUFFERS} shuffle buffers "
            f"of {shuffle_buffer:,} rows), so epochs after the first are not parsed again")


def bench_criteo(path: str | os.PathLike, batch_size: int = 8192, batches: int | None = None,
                 placement: str = "cpu", *, baseline: bool = True, shuffle: bool = True,
                 num_threads: int | None = None, baseline_rows: int | None = None,
                 trainer_step_ms: float | str | None = None, rounds: int = 5, settle_s: float | None = None,
                 progress: bool = True, warm_kernels: bool = True) -> dict:
    """Measure feedline and (``baseline``) the pandas baseline on the file at ``path``.

    ``batches``: None (default) times one whole epoch from constructing the Loader, which gives the end-to-end
    ``feedline_samples_per_s`` and ``speedup``; a number times that many batches after a short warm-up, which
    gives only the steady figures (an end-to-end figure needs a whole epoch). ``baseline_rows``: rows the baseline
    reads (None: all of them; its cost per row does not depend on the count, so fewer rows give the same rate
    sooner). ``trainer_step_ms``: None (no trainer), a step in milliseconds or ``"auto"`` (feedline's own batch
    time with no trainer): adds ``rounds`` alternating rounds without and then with the trainer, each after a
    ``settle_s`` pause (None: ``SETTLE_S``). ``warm_kernels``: first compile the numba kernels feedline will
    run, in a process of its own over a sample of the data (:mod:`feedline.benchmarks.kernel_warmup`), so that a
    new install's one-time compile is not timed.
    """
    step = check_trainer_step(trainer_step_ms)
    settle_s = SETTLE_S if settle_s is None else settle_s
    if batches is not None and (isinstance(batches, bool) or not isinstance(batches, int) or batches < 1):
        raise ValueError(f"batches must be a positive integer or None (one epoch), got {batches!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    path = os.fspath(path)
    if baseline and path.lower().endswith((".parquet", ".pq")):
        raise ValueError("the pandas baseline reads Criteo TSV (read_csv, then int(x, 16) per id); for Parquet data "
                         "pass --baseline none, or compare against the TSV it came from")
    if baseline:
        # Imported before any clock starts, so that neither side's time includes a library import (pandas with
        # pyarrow; numba, whose cached feedline kernels still load inside feedline's timed opening), and before
        # feedline's threads run: a module half imported on one thread must not be seen by another.
        import numba  # noqa: F401
        import pandas  # noqa: F401
    # What a new install compiles once, compiled before the clock starts (in a process of its own, so that this
    # one still loads the kernels from numba's cache inside its timing, as a user's later process does): the
    # table cache kept or not (the first epoch decides), so both.
    warmed = kernel_warmup.warm_kernels(path, ("loader_cache_on", "loader_cache_off"), batch_size=batch_size,
                                        table_size=TABLE_SIZE, placement=placement) if warm_kernels else None
    sync = cuda_sync()
    if sync is not None:
        sync()  # create the CUDA context before anything is timed
    rss_before = _peak_rss_mb()
    compiled_before = compiled_kernels()
    began = time.perf_counter()
    # The table cache (on by default) in a folder of this run's own: every run starts from the text, as a first
    # run does, and leaves nothing beside the data.
    cache_dir = tempfile.mkdtemp(prefix="feedline-bench-cache-")
    loader = open_loader(path, batch_size, placement, shuffle=shuffle, num_threads=num_threads,
                         cache=CacheSettings(directory=cache_dir))
    opened = time.perf_counter()
    result = {"pipeline": "criteo", "placement": placement, "batch_size": batch_size, "shuffle": shuffle,
              "num_threads": loader.num_threads, "open_s": round(opened - began, 3)}
    if warmed is not None:
        result.update(warmed)
    try:
        mine = _time_loader(loader, batches, sync, began, opened)
        result["first_batch_s"] = round(mine["first_batch_s"], 3)
        result["rows"] = mine["rows"]
        if batches is None:
            result["feedline_samples_per_s"] = mine["end_to_end_samples_per_s"]
            result["feedline_first_epoch_samples_per_s"] = mine["end_to_end_samples_per_s"]  # the same, older name
        result["feedline_steady_samples_per_s"] = mine["steady_samples_per_s"]
        # The process's peak resident memory after feedline's epoch and before the baseline runs (its
        # read_csv holds the whole file); with what the process held before the Loader, for the difference.
        result["peak_rss_mb"] = round(_peak_rss_mb(), 1)
        result["rss_before_loader_mb"] = round(rss_before, 1)
        frame = None
        if baseline:
            theirs = _time_baseline(path, batch_size, baseline_rows)
            result["baseline_rows"] = theirs["rows"]
            result["baseline_read_s"] = round(theirs["read_s"], 3)
            result["baseline_samples_per_s"] = theirs["end_to_end_samples_per_s"]
            result["baseline_steady_samples_per_s"] = theirs["steady_samples_per_s"]
            if batches is None:
                result["speedup"] = result["feedline_samples_per_s"] / result["baseline_samples_per_s"]
            result["steady_speedup"] = (result["feedline_steady_samples_per_s"]
                                        / result["baseline_steady_samples_per_s"])
            frame = theirs["frame"] if step is not None else None
        if step is not None:
            result.update(_with_trainer(loader, frame, step, batch_size=batch_size, batches=batches, rounds=rounds,
                                        settle_s=settle_s, sync=sync, progress=progress))
            result["notes"] = _trainer_notes(result, loader, path)
        decision = getattr(getattr(loader.source, "reader", None), "cache_decision", None)
        if decision is not None:
            result["table_cache"] = {"use": decision.use, "reason": decision.reason}
        # feedline's epochs and rounds are all timed (the baseline runs no numba)
        result.update(compiled_since(compiled_before))
        if warmed is not None:
            result.setdefault("notes", []).append(kernel_warmup.note(result))
    finally:
        loader.close()
        shutil.rmtree(cache_dir, ignore_errors=True)
    return result


def _trainer_notes(result: dict, loader: Loader, path: str) -> list[str]:
    """How the trainer rounds are counted, and why their capacity can differ from the first epoch: they run on
    epochs after it, which read the file from the page cache and, for a small file, from the Loader's parsed
    chunks."""
    notes = ["capacity_samples_per_s and the trainer rounds run on the epochs after the first, which read the "
             "file from the page cache; feedline_first_epoch_samples_per_s (opening included) is the first epoch",
             f"efficiency: each side's turn is a trainer round then a round with no trainer, so every trainer round "
             f"sits between two capacity rounds (batches_per_round"
             + (f": each side's batches in about {ROUND_S:g} s, counted in an untimed first round" if ROUND_S else "")
             + "); a round's efficiency is "
             "its delivered samples/s over min(capacity, demand), capacity being those two rounds' samples over "
             "their seconds and demand its samples over (batches x trainer_step_ms); efficiency is the median over "
             "rounds (efficiency_per_round); with trainer_step_auto the step is feedline's batch time in its first "
             "capacity round",
             "trainer_slice: " + ("both sides' batches are taken on the bench's main thread, which holds the "
                                  "trainer's short scheduler slice (loader/latency.py) through all rounds: feedline's "
                                  "stream gives it to the thread taking its batches, and the bench asks for it "
                                  "itself for the pandas baseline, whose batches a plain generator makes on that "
                                  "thread" if result.get("trainer_slice") else
                                  "no side's thread had the trainer's short scheduler slice (FEEDLINE_TRAINER_SLICE=0, "
                                  "or not available here)"),
             CEILING_NOTE, SPLIT_NOTE]
    cached = None
    if not os.path.isdir(path) and not path.lower().endswith((".parquet", ".pq")):
        cached = cached_note("feedline", len(loader.source), loader.shuffle_buffer)
    result["cached_after_first_epoch"] = cached is not None
    if cached:
        notes.append(cached + ": capacity_samples_per_s is a cached rate, not a parsing rate; use a larger file "
                              "to measure parsing")
    return notes


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports kB


def _time_loader(loader: Loader, batches: int | None, sync, began: float, opened: float) -> dict:
    """``first_batch_s`` (from ``began``, before the Loader was constructed, to the first batch in hand), and
    either one whole epoch (``batches`` None: end to end from ``began``, steady from ``opened``) or ``batches``
    batches after ``WARMUP_BATCHES`` (steady only)."""
    stream = iter(loader) if batches is None else endless(lambda: loader)
    try:
        rows = batch_size_of(next(stream))
        if sync is not None:
            sync()
        first_batch_s = time.perf_counter() - began
        if batches is not None:
            timed = measure_loader(lambda: stream, batches, WARMUP_BATCHES - 1, sync=sync)
            return {"first_batch_s": first_batch_s, "rows": timed["samples"],
                    "steady_samples_per_s": timed["samples_per_s"]}
        for batch in stream:
            rows += batch_size_of(batch)
        if sync is not None:
            sync()
        ended = time.perf_counter()
    finally:
        stream.close()
    return {"first_batch_s": first_batch_s, "rows": rows, "end_to_end_samples_per_s": rows / (ended - began),
            "steady_samples_per_s": rows / (ended - opened)}


def pandas_read(path: str, nrows: int | None = None):
    """The baseline's parsing: ``read_csv`` with the hex ids read as Python strings (``object`` is what ``.map``
    walks fastest)."""
    import pandas as pd

    names = ["label", *DENSE_NAMES, *CATEGORICAL_NAMES]
    return pd.read_csv(path, sep="\t", header=None, names=names, nrows=nrows,
                       dtype={name: object for name in CATEGORICAL_NAMES})


def pandas_transform(frame, table_size: int | None = TABLE_SIZE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The baseline's features from a frame of :func:`pandas_read` (left unchanged): per categorical column
    ``fillna`` + ``.map(int(x, 16))`` + ``% table_size`` (None: the ids themselves; a missing id is
    ``int("-1", 16)``, which is feedline's ``MISSING_ID``), and ``log1p`` of the dense columns with missing values
    as 0 and negatives clipped to 0. Returns float32 ``label`` [N], float32 ``dense`` [N, 13] and int64 ``ids``
    [N, 26]."""
    ids = np.empty((len(frame), len(CATEGORICAL_NAMES)), dtype=np.int64)
    for j, name in enumerate(CATEGORICAL_NAMES):
        column = frame[name].fillna("-1").map(lambda x: int(x, 16))
        ids[:, j] = (column if table_size is None else column % table_size).to_numpy(dtype=np.int64)
    dense = np.log1p(frame[list(DENSE_NAMES)].fillna(0).clip(lower=0).to_numpy(dtype=np.float32))
    label = frame["label"].to_numpy(dtype=np.float32)
    return label, dense, ids


def pandas_features(path: str, nrows: int | None = None, table_size: int | None = TABLE_SIZE
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The baseline's features, as a user writes them with pandas today: :func:`pandas_read` then
    :func:`pandas_transform`."""
    return pandas_transform(pandas_read(path, nrows), table_size)


def _to_batch(label: np.ndarray, dense: np.ndarray, ids: np.ndarray) -> dict:
    """One batch as the trainer takes it: torch tensors, the ids key-major with lengths and offsets."""
    values = torch.from_numpy(np.ascontiguousarray(ids.T).reshape(-1))
    return {"label": torch.from_numpy(label), "dense": torch.from_numpy(dense), "values": values,
            "lengths": torch.ones(values.numel(), dtype=torch.int32),
            "offsets": torch.arange(values.numel() + 1, dtype=torch.int64)}


def pandas_batches(frame, batch_size: int):
    """One epoch of the baseline as a stream: each batch's rows of ``frame`` converted when it is asked for, on
    the iterating thread (the work :func:`pandas_transform` does for the whole frame, batch by batch)."""
    for start in range(0, len(frame), batch_size):
        yield _to_batch(*pandas_transform(frame.iloc[start:start + batch_size]))


def _time_baseline(path: str, batch_size: int, nrows: int | None) -> dict:
    """The baseline once over the file (or its first ``nrows`` rows), as a user writes it: the whole frame read
    and converted, then cut into batches. End to end from nothing; steady from ``read_csv`` done."""
    began = time.perf_counter()
    frame = pandas_read(path, nrows)
    read = time.perf_counter()
    label, dense, ids = pandas_transform(frame)
    for start in range(0, len(label), batch_size):
        rows = slice(start, start + batch_size)
        _to_batch(label[rows], dense[rows], ids[rows])
    ended = time.perf_counter()
    return {"rows": len(label), "read_s": read - began, "end_to_end_samples_per_s": len(label) / (ended - began),
            "steady_samples_per_s": len(label) / (ended - read), "frame": frame}


def _with_trainer(loader: Loader, frame, step, *, batch_size: int, batches: int | None, rounds: int,
                  settle_s: float, sync, progress: bool) -> dict:
    """Alternating turns of feedline (its files open, epoch after epoch) and, with ``frame``, the baseline
    (:func:`pandas_batches` of the rows it read): rounds of about ``ROUND_S`` seconds, a trainer round between two
    capacity rounds (:func:`feedline.benchmarks.trainer.paired_rounds`). This thread takes both sides' batches and
    holds the trainer's short scheduler slice (:mod:`feedline.loader.latency`) throughout, for the baseline too."""
    contenders = {"feedline": lambda: loader}
    readahead = {"feedline": loader.prefetch}
    if frame is not None:
        contenders["baseline"] = lambda: pandas_batches(frame, batch_size)
        readahead["baseline"] = 0  # a generator on the trainer's thread makes nothing ahead
    tid = threading.get_native_id()
    sliced = latency.shorten(tid)
    try:
        runs = paired_rounds(contenders, readahead=readahead, rounds=rounds, per_round=(batches or 1) // rounds or 1,
                             step=step, round_s=ROUND_S, settle_s=settle_s, sync=sync, progress=progress,
                             desc="bench", ceiling=True)
    finally:
        if sliced:
            latency.restore(tid)
    summary = trainer_summary(runs["capacity"], runs["loaded"], runs["step_s"], auto=step == "auto",
                              baseline="baseline" if frame is not None else None, paired=True)
    return {"rounds": rounds, "batches_per_round": runs["per_round"], "untimed_batches_per_round": runs["untimed"],
            "readahead_batches": readahead, "trainer_slice": sliced, **summary,
            **ceiling_summary(runs["ceiling"], runs["step_s"])}
