"""`feedline bench --pipeline image-train|image-val`: feedline against torchvision and the decode-only bound,
on the same files, batch size and cores, each after a warm-up. The two loaders are measured in alternating
rounds and each reports its median round, so load from elsewhere on the machine biases neither.

With ``trainer_step_ms`` each loader's turn is then a round under a simulated trainer that sleeps that long per
batch on the iterating thread (``"auto"``: feedline's own batch time in its first round with no trainer) followed by
a round with none, so that every trainer round sits between two capacity rounds; see
:mod:`feedline.benchmarks.trainer` (``paired_rounds``)."""
from __future__ import annotations

from ..loader import Loader
from ..loader.devices import available_cores
from ..pipelines import image
from ..pipelines.image_sources import WebDataset
from ..pipelines.validate import one_of, positive_int
from . import image_baselines
from .trainer import (CEILING_NOTE, SPLIT_NOTE, ceiling_summary, check_trainer_step, cuda_sync, median_rate,
                      paired_rounds, trainer_summary)

# Both loaders read ahead in the background (DataLoader workers, feedline's prefetch queue); after a switch the
# idle one refills its queue, which would steal cores from the one being timed.
SETTLE_S = 1.5


def readahead_batches(loader) -> int:
    """Batches a loader makes ahead of its consumer: feedline's ``prefetch``; a DataLoader's ``prefetch_factor``
    per worker (none with no workers)."""
    if isinstance(loader, Loader):
        return loader.prefetch
    workers = getattr(loader, "num_workers", 0)
    return (getattr(loader, "prefetch_factor", None) or 0) * workers if workers else 0


def bench_image(data: str, *, pipeline: str = "image-train", placement: str = "cpu", batch_size: int = 64,
                batches: int = 30, warmup: int = 4, rounds: int = 5, output: str = "float",
                baseline: str | None = "torchvision", bound: bool = True, progress: bool = True,
                trainer_step_ms: float | str | None = None, settle_s: float | None = None) -> dict:
    """``batches``: timed batches per loader, split over ``rounds`` rounds; a round is raised to at least
    ``ROUND_OVER_READAHEAD`` times the largest read-ahead (JSON ``batches_per_round``), so the total can exceed
    ``batches``. ``trainer_step_ms``: None (no trainer), a step in milliseconds, or ``"auto"``. ``settle_s``: the
    pause before each turn (None: ``SETTLE_S``)."""
    one_of("pipeline", pipeline, ("image-train", "image-val"))
    if baseline not in (None, "torchvision"):
        raise ValueError(f"baseline for image pipelines must be 'torchvision' or none, got {baseline!r}")
    positive_int("batches", batches)
    positive_int("rounds", rounds)
    step = check_trainer_step(trainer_step_ms)
    settle_s = SETTLE_S if settle_s is None else settle_s
    make = image.train if pipeline == "image-train" else image.val
    spec = make(data, output=output)
    cores = available_cores()
    contenders = {"feedline": Loader(spec, batch_size=batch_size, placement=placement,
                                     shuffle=pipeline == "image-train", last_batch="drop")}
    if baseline:
        contenders["baseline"] = _torchvision(pipeline, output)(data, batch_size, cores)
    readahead = {name: readahead_batches(loader) for name, loader in contenders.items()}
    sync = cuda_sync()
    if sync is not None:
        sync()  # create the CUDA context before anything is timed
    runs = paired_rounds({name: (lambda l=loader: l) for name, loader in contenders.items()}, readahead=readahead,
                         rounds=rounds, per_round=max(batches // rounds, 1), step=step, warmup=warmup,
                         settle_s=settle_s, sync=sync, progress=progress, desc=f"bench {pipeline}", ceiling=True)
    capacity, loaded, step_s = runs["capacity"], runs["loaded"], runs["step_s"]
    per_round, untimed = runs["per_round"]["feedline"], runs["untimed"]
    feedline = contenders["feedline"]
    result = {"pipeline": pipeline, "placement": spec.describe_cut(feedline.cut), "output": output,
              "batch_size": batch_size, "batches": per_round * rounds, "rounds": rounds,
              "batches_per_round": per_round, "untimed_batches_per_round": untimed, "readahead_batches": readahead,
              "cores": cores, "dataset_size": len(feedline.source),
              "feedline_samples_per_s": median_rate(capacity["feedline"])}
    feedline.close()
    if baseline:
        result["baseline"] = f"torchvision ImageFolder + DataLoader({cores} workers)"
        result["baseline_samples_per_s"] = median_rate(capacity["baseline"])
        result["speedup"] = result["feedline_samples_per_s"] / result["baseline_samples_per_s"]
        result["speedup_per_round"] = [round(f["samples_per_s"] / b["samples_per_s"], 3)
                                       for f, b in zip(capacity["feedline"], capacity["baseline"])]
        del contenders["baseline"]
    if loaded is not None:
        result.update(trainer_summary(capacity, loaded, step_s, auto=step == "auto",
                                      baseline="baseline" if baseline else None, paired=True))
        result.update(ceiling_summary(runs["ceiling"], step_s))
    if bound and not isinstance(spec.source, WebDataset):  # the decode bound decodes files by path
        files = list(feedline.source.paths[: max(batch_size * batches, 512)])
        decode = image_baselines.decode_bound(files, workers=cores)
        result["bound_samples_per_s"] = decode["bound_samples_per_s"]
        result["bound_source"] = decode["bound_source"]
        result["fraction_of_bound"] = result["feedline_samples_per_s"] / decode["bound_samples_per_s"]
        result["notes"] = [bound_note(spec)]
    if loaded is not None:
        result.setdefault("notes", []).extend((CEILING_NOTE, SPLIT_NOTE))
    return result


def bound_note(spec) -> str:
    """What ``bound_samples_per_s`` is, and why ``fraction_of_bound`` can exceed 1."""
    what = ("bound_samples_per_s is an estimate, not a limit: the faster of PIL and DALI's CPU decoder decoding "
            "whole files on every core, measured apart from the rounds")
    if any(getattr(stage, "roi", False) for stage in spec.stages):
        return (what + f"; {spec.name} decodes only each crop window (region-of-interest decoding), less work than "
                       f"a whole file, so fraction_of_bound can exceed 1")
    return what + "; fraction_of_bound can exceed 1 by measurement noise"


def _torchvision(pipeline: str, output: str):
    if output == "uint8":
        return (image_baselines.torchvision_train_loader_uint8 if pipeline == "image-train"
                else image_baselines.torchvision_val_loader_uint8)
    return image_baselines.torchvision_train_loader if pipeline == "image-train" else image_baselines.torchvision_val_loader