"""`feedline bench --pipeline image-train|image-val`: feedline against torchvision and the decode-only bound,
on the same files, batch size and cores, each after a warm-up."""
from __future__ import annotations

import os
from typing import Callable, Iterable

from tqdm import tqdm

from ..loader import Loader
from ..pipelines import image
from . import image_baselines


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _counted(factory: Callable[[], Iterable], bar: tqdm) -> Callable[[], Iterable]:
    def run():
        for batch in factory():
            bar.update(1)
            yield batch
    return run


def bench_image(data: str, *, pipeline: str = "image-train", placement: str = "cpu", batch_size: int = 64,
                batches: int = 30, warmup: int = 4, output: str = "float", baseline: str | None = "torchvision",
                bound: bool = True, progress: bool = True) -> dict:
    if pipeline not in ("image-train", "image-val"):
        raise ValueError(f"pipeline must be 'image-train' or 'image-val', got {pipeline!r}")
    if baseline not in (None, "torchvision"):
        raise ValueError(f"baseline for image pipelines must be 'torchvision' or none, got {baseline!r}")
    make = image.train if pipeline == "image-train" else image.val
    spec = make(data, output=output)
    cores = _cores()
    steps = (batches + warmup) * (2 if baseline else 1)
    result = {"pipeline": pipeline, "placement": placement, "output": spec.stages[-1].params["output"].value,
              "batch_size": batch_size, "batches": batches, "cores": cores, "dataset_size": len(spec.source)}
    with tqdm(total=steps, desc=f"bench {pipeline}", unit="batch", disable=not progress) as bar:
        loader = Loader(spec, batch_size=batch_size, placement=placement, shuffle=pipeline == "image-train",
                        last_batch="drop")
        result["placement"] = spec.describe_cut(loader.cut)
        result["feedline_samples_per_s"] = image_baselines.measure_loader(
            _counted(lambda: loader, bar), batches, warmup)["samples_per_s"]
        loader.close()
        if baseline:
            bar.set_description("bench torchvision")
            tv = _torchvision(pipeline, output)(data, batch_size, cores)
            result["baseline"] = f"torchvision ImageFolder + DataLoader({cores} workers)"
            result["baseline_samples_per_s"] = image_baselines.measure_loader(
                _counted(lambda: tv, bar), batches, warmup)["samples_per_s"]
            result["speedup"] = result["feedline_samples_per_s"] / result["baseline_samples_per_s"]
            del tv
    if bound:
        files = list(spec.source.paths[: max(batch_size * batches, 512)])
        decode = image_baselines.decode_bound(files, workers=cores)
        result["bound_samples_per_s"] = decode["bound_samples_per_s"]
        result["bound_source"] = decode["bound_source"]
        result["fraction_of_bound"] = result["feedline_samples_per_s"] / decode["bound_samples_per_s"]
    return result


def _torchvision(pipeline: str, output: str):
    if output == "uint8":
        return (image_baselines.torchvision_train_loader_uint8 if pipeline == "image-train"
                else image_baselines.torchvision_val_loader_uint8)
    return image_baselines.torchvision_train_loader if pipeline == "image-train" else image_baselines.torchvision_val_loader

