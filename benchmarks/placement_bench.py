"""`feedline bench --placement auto`: the auto placement against every static placement this machine can
run (each valid cut, each thread count 1..cores) and the default configuration users start from, measured
in the same run, in alternating rounds, each reporting its median round."""
from __future__ import annotations

import math
import time
from typing import Callable, Iterable

import torch
from tqdm import tqdm

from ..loader import Loader
from ..loader.devices import available_cores, gpu_available
from ..loader.epochs import endless
from ..loader.placement.rounds import NOISE_SIGMAS, measure_rounds
from ..pipelines.spec import PipelineSpec
from .image_baselines import measure_loader
from .trainer import ROUND_OVER_READAHEAD

EPOCH_FOR_SHARE = 10_000  # the profiling cost is stated as a share of an epoch of this many samples
SETTLE_S = 1.0  # before each turn: the other loaders finish refilling their read-ahead queues
DALI_PREFETCH_QUEUE_DEPTH = 2  # DALI's default, set explicitly in the default configuration below
MAX_ROUNDS = 8          # rounds stop here even if a median is not yet stable
ROUND_TOLERANCE = 0.02  # a median is stable once its relative standard error is at most this


def bench_placements(spec: PipelineSpec, *, batch_size: int, batches: int = 20, rounds: int = 3,
                     max_rounds: int = MAX_ROUNDS, tolerance: float = ROUND_TOLERANCE,
                     warmup: int = 2, default: tuple[str, Callable[[], Iterable]] | None = None,
                     default_readahead: int = DALI_PREFETCH_QUEUE_DEPTH, progress: bool = True) -> dict:
    """``batches``: timed batches per contender over ``rounds`` rounds; a round is raised to at least
    ``ROUND_OVER_READAHEAD`` times the largest read-ahead (``default_readahead`` for ``default``; feedline's
    ``prefetch``), so the total can exceed ``batches`` (JSON ``batches_per_round``). Rounds go on past
    ``rounds`` until every contender's median is stable within ``tolerance`` (its relative standard error), at
    most ``max_rounds``: the JSON's ``spread`` holds each one's, ``stable`` whether they all held."""
    cores = available_cores()
    gpu = gpu_available()
    device = "cuda" if gpu else "cpu"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    sync()  # create the CUDA context (where there is one) before anything is timed
    contenders: dict[str, Callable[[], Iterable]] = {}
    loaders: list[Loader] = []
    began = time.perf_counter()
    auto = Loader(spec, batch_size, placement="auto", device=device, last_batch="drop")
    loaders.append(auto)
    contenders["auto"] = lambda: auto
    for cut in (spec.valid_cuts() if gpu else [spec.all_cpu]):
        for threads in range(1, cores + 1):
            name = f"{spec.describe_cut(cut)}/{threads}t"
            mapping = {s.name: b.value for s, b in zip(spec.stages, spec.backends_at(cut).values())}
            loader = Loader(spec, batch_size, placement=mapping, device=device, num_threads=threads,
                            last_batch="drop")
            loaders.append(loader)
            contenders[name] = (lambda l=loader: l)
    if default is not None:
        contenders[default[0]] = default[1]
    streams = {name: endless(make) for name, make in contenders.items()}
    with tqdm(total=len(streams) * (rounds + 1), desc="bench placements", unit="run", disable=not progress) as bar:
        for name, stream in streams.items():
            for _ in range(warmup):
                next(stream)
            bar.update(1)
        setup_s = time.perf_counter() - began
        # read after the warm-up: the auto loader chooses its prefetch depth at its first iteration. A Loader reads
        # ahead its queue (prefetch), its runner's own (DALI's prefetch queue holds as many) and the batch in its
        # batch thread's hands: counted as made in a round, they had made 8-batch rounds ~1.3x too fast, by as
        # much as the queues had filled, and auto / best static noisy by +-0.11 to 0.16 (two standard errors)
        untimed = max([2 * l.prefetch + 1 for l in loaders] + [default_readahead if default is not None else 1])
        per_round = max(batches // rounds, ROUND_OVER_READAHEAD * untimed)

        def turn(name: str) -> float:
            bar.set_description(f"bench {name}")
            time.sleep(SETTLE_S)  # let the other loaders finish refilling their read-ahead queues
            rate = measure_loader(lambda: streams[name], per_round, untimed, sync=sync)["samples_per_s"]
            bar.update(1)
            return rate

        rounds = max(rounds, 2)  # a spread needs two
        measured = measure_rounds(list(streams), turn, min_rounds=rounds, max_rounds=max(rounds, max_rounds),
                                  tolerance=tolerance)
    medians = measured.medians
    spreads = measured.spreads
    statics = {n: v for n, v in medians.items() if n != "auto" and (default is None or n != default[0])}
    best = max(statics, key=statics.get)
    profile_s = auto.plan.get("start_seconds", 0.0)  # profiling plus the measured thread check
    done = measured.rounds
    result = {"pipeline": spec.name, "cores": cores, "batch_size": batch_size, "batches": per_round * done,
              "rounds": done, "min_rounds": rounds, "max_rounds": max(rounds, max_rounds), "stable": measured.stable,
              "tolerance": tolerance, "spread": {n: (v if math.isfinite(v) else None) for n, v in spreads.items()},
              "rates": {n: list(r) for n, r in measured.rates.items()},
              "batches_per_round": per_round, "untimed_batches_per_round": untimed,
              "auto_placement": auto.plan["placement"], "auto_threads": auto.plan["threads"],
              "auto_prefetch": auto.plan["prefetch"],
              # why auto placed as it did: its moves (the first is its initial plan) and its measured thread check
              "auto_history": auto.plan.get("history"), "auto_thread_check": auto.plan.get("thread_check"),
              "auto_samples_per_s": medians["auto"], "best_static_samples_per_s": medians[best],
              "best_static_placement": best, "auto_vs_best_static": medians["auto"] / medians[best],
              # the ratio's noise: NOISE_SIGMAS standard errors of the two medians together
              "auto_vs_best_static_noise": NOISE_SIGMAS * math.hypot(spreads["auto"], spreads[best]),
              "profile_seconds": profile_s,
              "profile_share_of_10k_epoch": profile_s / (EPOCH_FOR_SHARE / medians["auto"]),
              "setup_seconds": setup_s,
              "static_samples_per_s": statics}
    if default is not None:
        result["default"] = default[0]
        result["default_recipe"] = getattr(default[1], "recipe", None) or default[0]
        result["default_samples_per_s"] = medians[default[0]]
        result["auto_vs_default"] = medians["auto"] / medians[default[0]]
    for stream in streams.values():
        stream.close()
    return result


def dali_default_image_loader(data: str, *, train: bool, size: int, output: str, batch_size: int,
                              gpu: bool | None = None) -> Callable[[], Iterable]:
    """The configuration a DALI user starts from for the standard recipes (``train``: image.train, else
    image.val, at ``size`` with ``output``), through DALI's PyTorch iterator with one thread per core: file reader,
    fused random-crop decode (train) or decode, resize and crop_mirror_normalize.

    ``gpu`` (None: where a CUDA GPU is usable) runs DALI's own GPU recipe, as in its ResNet-50 example: ``mixed``
    decoding (nvJPEG) with the example's nvJPEG memory padding, resize and crop_mirror_normalize on the GPU,
    labels copied to the GPU, ``device_id=0``. Otherwise everything runs on DALI's CPU backend. The returned
    callable's ``recipe`` names which."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    from ..loader.sources import open_source
    from ..pipelines.image import IMAGENET_MEAN, IMAGENET_STD, image_source

    if gpu is None:
        gpu = gpu_available()
    source = open_source(image_source(data))
    uint8 = output == "uint8"
    decoder = "mixed" if gpu else "cpu"
    # nvJPEG's preallocation in DALI's ResNet-50 example, so that it does not reallocate on larger images
    padding = {"device_memory_padding": 211025920, "host_memory_padding": 140544512} if gpu else {}

    @pipeline_def(batch_size=batch_size, num_threads=available_cores(), device_id=0 if gpu else None, seed=0,
                  prefetch_queue_depth=DALI_PREFETCH_QUEUE_DEPTH)
    def default_pipeline():
        jpegs, labels = fn.readers.file(files=list(source.paths), labels=source.labels.tolist(),
                                        random_shuffle=train, name="reader")
        if train:
            images = fn.decoders.image_random_crop(jpegs, device=decoder, output_type=types.RGB, **padding)
            images = fn.resize(images, resize_x=size, resize_y=size)
            mirror = fn.random.coin_flip()
        else:
            images = fn.decoders.image(jpegs, device=decoder, output_type=types.RGB, **padding)
            images = fn.resize(images, resize_shorter=round(size * 256 / 224))
            mirror = 0
        # after a mixed decoder, resize and crop_mirror_normalize take GPU images and run on the GPU
        if uint8:
            images = fn.crop_mirror_normalize(images, crop=(size, size), mirror=mirror, dtype=types.UINT8,
                                              output_layout="HWC")
        else:
            images = fn.crop_mirror_normalize(images, crop=(size, size), mirror=mirror, dtype=types.FLOAT,
                                              output_layout="CHW", mean=[255 * m for m in IMAGENET_MEAN],
                                              std=[255 * s for s in IMAGENET_STD])
        return images, (labels.gpu() if gpu else labels)

    pipe = default_pipeline()
    iterator = DALIGenericIterator(pipe, ["image", "label"], reader_name="reader",
                                   last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)

    def batches() -> Iterable:
        return ({"image": b[0]["image"], "label": b[0]["label"]} for b in iterator)

    batches.recipe = ("DALI GPU (mixed decode, GPU resize and crop_mirror_normalize, device_id=0)" if gpu
                      else "DALI CPU (cpu decode, resize and crop_mirror_normalize)")
    return batches
