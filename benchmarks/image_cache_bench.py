"""Image epochs with the image cache (issue 22) against the same pipeline uncached, in one run: samples per second
of each epoch, so the epochs after the first (which read the cache) compare with the first and with the uncached
pipeline's epochs.

Each side is one Loader (seed 0, default shuffling: none for image-val) run for ``epochs`` epochs; an epoch is timed
from asking for its first batch to holding its last (with the device synchronised on a GPU). The uncached side runs
first, so both read the files from the page cache after its first epoch. ``cache_dir`` puts the cache on disk (a new
temporary folder under it, removed afterwards); without it the cache is in RAM within ``memory_gib``.
Run: ``python -m feedline.benchmarks.image_cache_bench DATA --pipeline image-val --epochs 3 [--json out.json]``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch

from ..loader.cache_policy import CacheSettings
from ..loader.loader import Loader
from ..pipelines import image
from ..pipelines.validate import finite_at_least, int_at_least, one_of, positive_int
from .printed import print_result


def bench_image_cache(data: str | os.PathLike, *, pipeline: str = "image-val", epochs: int = 3, batch_size: int = 64,
                      size: int = 224, placement: str = "cpu", cache: str = "auto", memory_gib: float = 8.0,
                      cache_dir: str | None = None, num_threads: int | None = None) -> dict:
    """``epochs`` epochs of ``data`` through ``pipeline`` ("image-val" or "image-train") uncached and cached
    (``cache``: "auto" or "on")."""
    data = os.fspath(data)
    pipeline = one_of("pipeline", pipeline, ("image-val", "image-train"))
    epochs = int_at_least("epochs", epochs, 2)
    batch_size = positive_int("batch_size", batch_size)
    cache = one_of("cache", cache, ("auto", "on"))
    memory = int(finite_at_least("memory_gib", memory_gib, 0.0) * (1 << 30))
    spec = (image.val if pipeline == "image-val" else image.train)(data, size=size)
    folder = tempfile.mkdtemp(prefix="feedline-image-cache-bench-", dir=cache_dir) if cache_dir else None
    try:
        settings = CacheSettings(mode=cache, memory_bytes=memory, directory=folder and os.path.join(folder, "c"))
        result = {"data": data, "pipeline": pipeline, "epochs": epochs, "batch_size": batch_size, "size": size,
                  "placement": placement, "cache": cache, "memory_budget_bytes": memory,
                  "cache_dir": folder, "uncached": _epochs(spec, "off", epochs, batch_size, placement, num_threads),
                  "cached": _epochs(spec, settings, epochs, batch_size, placement, num_threads)}
        later = slice(1, None)
        cached, uncached = result["cached"]["samples_per_s"], result["uncached"]["samples_per_s"]
        result["cached_later_over_cached_first"] = round(statistics.mean(cached[later]) / cached[0], 3)
        result["cached_later_over_uncached_later"] = round(statistics.mean(cached[later]) /
                                                           statistics.mean(uncached[later]), 3)
        return result
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


def _epochs(spec, cache, epochs: int, batch_size: int, placement: str, num_threads: int | None) -> dict:
    device = "cuda" if placement != "cpu" and torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    seconds, rates = [], []
    with Loader(spec, batch_size, placement=placement, device=device, cache=cache,
                num_threads=num_threads) as loader:
        for _ in range(epochs):
            samples = 0
            started = time.perf_counter()
            for batch in loader:
                samples += int(batch.get("valid", batch["index"] >= 0).sum())
            sync()
            elapsed = time.perf_counter() - started
            seconds.append(round(elapsed, 3))
            rates.append(round(samples / elapsed, 1))
        decision = loader.plan["cache"]
    return {"epoch_s": seconds, "samples_per_s": rates, "samples": samples, "decision": decision}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="an image folder (feedline make-data images --out DIR)")
    parser.add_argument("--pipeline", choices=("image-val", "image-train"), default="image-val")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--placement", choices=("cpu", "gpu", "auto"), default="cpu")
    parser.add_argument("--cache", choices=("auto", "on"), default="auto")
    parser.add_argument("--memory-gib", type=float, default=8.0, help="the RAM budget of the cache")
    parser.add_argument("--cache-dir", default=None, help="put the cache on disk, in a temporary folder under this")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args(argv)
    result = bench_image_cache(args.data, pipeline=args.pipeline, epochs=args.epochs, batch_size=args.batch_size,
                               size=args.size, placement=args.placement, cache=args.cache,
                               memory_gib=args.memory_gib, cache_dir=args.cache_dir, num_threads=args.threads)
    print_result(result, args.json)
    return result


if __name__ == "__main__":
    main()
