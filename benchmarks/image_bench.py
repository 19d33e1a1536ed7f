"""`feedline bench --pipeline image-train|image-val`: feedline against torchvision and the decode-only bound,
on the same files, batch size and cores, each after a warm-up. The two loaders are measured in alternating
rounds and each reports its median round, so load from elsewhere on the machine biases neither."""
from __future__ import annotations

import statistics
import time
from typing import Iterable

from tqdm import tqdm

from ..loader import Loader
from ..loader.devices import available_cores
from ..loader.epochs import endless
from ..pipelines import image
from . import image_baselines


# Both loaders read ahead in the background (DataLoader workers, DALI's prefetch queue); after a switch the
# idle one refills its queue, which would steal cores from the one being timed.
SETTLE_S = 1.5


def _counted(loader: Iterable, bar: tqdm):
    """Epoch after epoch of one loader, so rounds continue where the last one stopped, ticking the bar."""
    for batch in endless(lambda: loader):
        bar.update(1)
        yield batch


def bench_image(data: str, *, pipeline: str = "image-train", placement: str = "cpu", batch_size: int = 64,
                batches: int = 30, warmup: int = 4, rounds: int = 5, output: str = "float",
                baseline: str | None = "torchvision", bound: bool = True, progress: bool = True) -> dict:
    if pipeline not in ("image-train", "image-val"):
        raise ValueError(f"pipeline must be 'image-train' or 'image-val', got {pipeline!r}")
    if baseline not in (None, "torchvision"):
        raise ValueError(f"baseline for image pipelines must be 'torchvision' or none, got {baseline!r}")
    make = image.train if pipeline == "image-train" else image.val
    spec = make(data, output=output)
    cores = available_cores()
    per_round = batches // rounds or 1
    contenders = {"feedline": Loader(spec, batch_size=batch_size, placement=placement,
                                     shuffle=pipeline == "image-train", last_batch="drop")}
    if baseline:
        contenders["baseline"] = _torchvision(pipeline, output)(data, batch_size, cores)
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    total = len(contenders) * (warmup + (per_round + 1) * rounds)
    with tqdm(total=total, desc=f"bench {pipeline}", unit="batch", disable=not progress) as bar:
        streams = {name: _counted(loader, bar) for name, loader in contenders.items()}
        for name, stream in streams.items():
            image_baselines.measure_loader(lambda: stream, 1, max(warmup - 1, 0))
        for _ in range(rounds):
            for name, stream in streams.items():
                bar.set_description(f"bench {name}")
                time.sleep(SETTLE_S)  # let the other loader's workers finish refilling their queues
                rates[name].append(image_baselines.measure_loader(lambda: stream, per_round, 1)["samples_per_s"])
        for stream in streams.values():
            stream.close()
    feedline = contenders["feedline"]
    result = {"pipeline": pipeline, "placement": spec.describe_cut(feedline.cut), "output": output,
              "batch_size": batch_size, "batches": per_round * rounds, "rounds": rounds, "cores": cores,
              "dataset_size": len(feedline.source),
              "feedline_samples_per_s": statistics.median(rates["feedline"])}
    feedline.close()
    if baseline:
        result["baseline"] = f"torchvision ImageFolder + DataLoader({cores} workers)"
        result["baseline_samples_per_s"] = statistics.median(rates["baseline"])
        result["speedup"] = result["feedline_samples_per_s"] / result["baseline_samples_per_s"]
        result["speedup_per_round"] = [round(f / b, 3) for f, b in zip(rates["feedline"], rates["baseline"])]
        del contenders["baseline"]
    if bound:
        files = list(feedline.source.paths[: max(batch_size * batches, 512)])
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
