"""Criteo TSV epoch by epoch with the table cache (issue 22), against the same rows converted once by
``feedline convert`` and against parsing every epoch, in one run: rows per second of each epoch, so the epochs
after the first (which read the cache) compare with the converted table's.

Each side is one Loader (CPU placement, seed 0, shuffled) run for ``epochs`` epochs, the sides taking turns
epoch by epoch (so a machine's load drifting during the run reaches each side alike); an epoch is timed from
asking for its first batch to holding its last (the Loader's opening is ``open_s``), by the wall clock
(``samples_per_s``) and by the process's CPU time (``cpu_s``: all its threads, which a busy machine disturbs
less). The converted folder and the cache are written into a temporary folder (``CacheSettings.directory``),
never beside the data, and removed afterwards. Run: ``python -m feedline.benchmarks.table_cache_bench day.tsv --epochs 3 [--json out.json]``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from ..loader.cache_policy import CacheSettings
from ..loader.cpu_time import process_cpu
from ..loader.epochs import batch_size_of
from ..loader.loader import Loader
from ..loader.sources.text_to_columnar import convert
from ..pipelines.criteo import criteo
from ..pipelines.validate import int_at_least, one_of, positive_int
from .printed import print_result


def bench_table_cache(path: str | os.PathLike, *, epochs: int = 3, batch_size: int = 8192, cache: str = "auto",
                      num_threads: int | None = None, work: str | None = None) -> dict:
    """Epochs of ``path`` (a Criteo TSV, plain or gzip) read three ways: ``converted`` (``feedline convert``
    first, its time in ``convert_s``), ``cached`` (``cache``: "auto" or "on", the cache starting empty) and
    ``parsed`` (``cache="off"``). ``work``: where the conversion and the cache go (default: a new temporary
    folder, removed afterwards)."""
    path = os.fspath(path)
    epochs = int_at_least("epochs", epochs, 2)
    batch_size = positive_int("batch_size", batch_size)
    cache = one_of("cache", cache, ("auto", "on"))
    folder = tempfile.mkdtemp(prefix="feedline-table-cache-bench-", dir=work)
    try:
        started = time.perf_counter()
        convert(criteo(path, format="tsv").source, os.path.join(folder, "converted"))
        result = {"data": path, "epochs": epochs, "batch_size": batch_size,
                  "convert_s": round(time.perf_counter() - started, 3)}
        sides = {"converted": (os.path.join(folder, "converted"), "off"),
                 "cached": (path, CacheSettings(mode=cache, directory=os.path.join(folder, "cache"))),
                 "parsed": (path, "off")}
        result.update(_epochs(sides, epochs, batch_size, num_threads))
        later = slice(1, None)
        for measure, better in (("samples_per_s", 1), ("cpu_s", -1)):
            mean = {side: statistics.mean(result[side][measure][later]) for side in sides}
            for other in ("converted", "parsed"):
                result[f"cached_later_over_{other}_later_{measure}"] = round((mean["cached"] / mean[other]) ** better,
                                                                             3)
        return result
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _epochs(sides: dict, epochs: int, batch_size: int, num_threads: int | None) -> dict:
    """Each side's Loader opened, then epoch by epoch every side's epoch in turn."""
    out, loaders = {}, {}
    try:
        for side, (source, cache) in sides.items():
            began = time.perf_counter()
            loaders[side] = Loader(criteo(source), batch_size, placement="cpu", seed=0, num_threads=num_threads,
                                   cache=cache)
            out[side] = {"open_s": round(time.perf_counter() - began, 3), "samples_per_s": [], "cpu_s": []}
        for _ in range(epochs):
            for side, loader in loaders.items():
                rows = 0
                cpu, started = process_cpu(), time.perf_counter()
                for batch in loader:
                    rows += batch_size_of(batch)
                out[side]["samples_per_s"].append(round(rows / (time.perf_counter() - started)))
                out[side]["cpu_s"].append(round(process_cpu() - cpu, 3))
                out[side]["rows"] = rows
        for side, loader in loaders.items():
            decision = getattr(loader.source.reader, "cache_decision", None)
            if decision is not None:
                out[side]["decision"] = decision.reason
    finally:
        for loader in loaders.values():
            loader.close()
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m feedline.benchmarks.table_cache_bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="a Criteo TSV file (plain or gzip)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--cache", choices=("auto", "on"), default="auto")
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--work", default=None, help="folder for the conversion and the cache (default: the "
                                                      "system's temporary folder)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the result here")
    args = parser.parse_args(argv)
    result = bench_table_cache(args.data, epochs=args.epochs, batch_size=args.batch_size, cache=args.cache,
                               num_threads=args.num_threads, work=args.work)
    print_result(result, args.json)
    return result


if __name__ == "__main__":
    main()
