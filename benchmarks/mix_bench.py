"""A mix's throughput, each source's delivered share, and (given one) the single pipeline it is compared with,
measured in alternating rounds in the same run (``feedline bench --pipeline ... --mix NAME=PATH[:WEIGHT] ...``).

``python -m feedline.benchmarks.mix_bench FOLDER`` is the mixing overhead check: FOLDER's images as one
``image.train`` pipeline against the same images split in two sources (every other file, as ``ImageList``s)
mixed 50/50; ``mix_over_single`` is the mix's throughput over the single folder's (the target: at least 0.95).
"""
from __future__ import annotations

import argparse
import math
from typing import Iterator, Mapping

import numpy as np
from tqdm import tqdm

from ..loader import Loader
from ..loader.devices import available_cores
from ..loader.epochs import endless
from ..loader.sources import open_source
from ..pipelines import image
from ..pipelines.image_sources import ImageFolder, ImageList
from ..pipelines.mix import mix
from ..pipelines.spec import PipelineSpec
from .image_bench import SETTLE_S
from .printed import print_result
from .trainer import ROUND_OVER_READAHEAD, alternate, cuda_sync, median_rate


def readahead(loader, weights=None) -> int:
    """Batches a loader can hold made ahead of its taker (they fill while the other contender is timed): its own
    queue and its runner's (an image runner's DALI queue is ``prefetch`` deep); a mix's sources each hold two
    such queues of batches of their own, which last ``1 / weight`` mixed batches each, and the first source to
    run dry bounds it."""
    if loader is None:
        return 0
    if weights is None:
        return 2 * loader.prefetch
    return loader.prefetch + min(math.ceil(2 * loader.prefetch / w) for w in weights) + 1


def _sources_counted(stream: Iterator, counts: np.ndarray, tick) -> Iterator:
    """``stream``'s batches, adding up the valid samples of each source as they are delivered: with NumPy on the
    batch's tensors (torch's boolean indexing there, on the timed thread, cost a Criteo mix a quarter of its rate
    in ``feedline bench``, a cost the single source it is compared with never paid)."""
    for batch in stream:
        counts += np.bincount(batch["source"].cpu().numpy()[batch["valid"].cpu().numpy()], minlength=counts.size)
        tick()
        yield batch


def bench_mix(parts: Mapping[str, tuple[PipelineSpec, float]], *, single: PipelineSpec | None = None,
              placement: str = "cpu", batch_size: int = 64, batches: int = 60, rounds: int = 3, warmup: int = 3,
              window: int = 1000, progress: bool = True, settle_s: float = SETTLE_S) -> dict:
    """``parts``: name -> (pipeline, weight). The mix, and ``single`` if given, each over ``batches`` timed
    batches split in ``rounds`` alternating rounds after ``warmup`` untimed ones; a round is at least
    ``ROUND_OVER_READAHEAD`` times the larger read-ahead (``readahead``), and starts by taking that much untimed."""
    spec = mix({n: p for n, (p, _) in parts.items()}, {n: w for n, (_, w) in parts.items()}, window=window)
    contenders = {"mix": Loader(spec, batch_size=batch_size, placement=placement, last_batch="drop")}
    if single is not None:
        contenders["single"] = Loader(single, batch_size=batch_size, placement=placement, last_batch="drop")
    untimed = max(readahead(contenders["mix"], spec.weights), readahead(contenders.get("single")))
    per_round = max(batches // rounds, ROUND_OVER_READAHEAD * untimed)
    counts = np.zeros(len(spec.names), dtype=np.int64)
    sync = cuda_sync()
    if sync is not None:
        sync()
    total = len(contenders) * (warmup + rounds * (untimed + per_round))
    with tqdm(total=total, desc="bench mix", unit="batch", disable=not progress) as bar:
        streams = {"mix": _sources_counted(endless(lambda: contenders["mix"]), counts, lambda: bar.update(1))}
        if single is not None:
            streams["single"] = _counted(endless(lambda: contenders["single"]), lambda: bar.update(1))
        for stream in streams.values():
            for _ in range(warmup):
                next(stream)
        runs = alternate(streams, rounds=rounds, per_round=per_round, untimed=untimed, settle_s=settle_s, sync=sync,
                         on_turn=lambda name: bar.set_description(f"bench {name}"))
        for stream in streams.values():
            stream.close()
    loader = contenders["mix"]
    result = {"pipeline": spec.name, "placement": spec.describe_cut(loader.cut), "batch_size": batch_size,
              "batches": per_round * rounds, "rounds": rounds, "untimed_batches_per_round": untimed, "cores": available_cores(), "window": window,
              "sources": {n: len(part) for n, part in zip(spec.names, loader.dataset.parts)},
              "weights": dict(zip(spec.names, spec.weights)),
              "delivered_share": {n: float(c) / max(int(counts.sum()), 1) for n, c in zip(spec.names, counts)},
              "delivered_samples": {n: int(c) for n, c in zip(spec.names, counts)},
              "mix_samples_per_s": median_rate(runs["mix"])}
    if single is not None:
        result["single"] = single.name
        result["single_samples_per_s"] = median_rate(runs["single"])
        result["mix_over_single"] = result["mix_samples_per_s"] / result["single_samples_per_s"]
        result["mix_over_single_per_round"] = [round(m["samples_per_s"] / s["samples_per_s"], 3)
                                               for m, s in zip(runs["mix"], runs["single"])]
    for loader in contenders.values():
        loader.close()
    return result


def _counted(stream: Iterator, tick) -> Iterator:
    for batch in stream:
        tick()
        yield batch


def split_folder(folder: str) -> tuple[ImageList, ImageList]:
    """A folder's images as two sources: every other file (as listed), with its label."""
    listed = open_source(ImageFolder(str(folder)))
    paths, labels = list(listed.paths), [int(x) for x in listed.labels]
    return ImageList(tuple(paths[0::2]), tuple(labels[0::2])), ImageList(tuple(paths[1::2]), tuple(labels[1::2]))


def bench_split(folder: str, *, placement: str = "cpu", batch_size: int = 64, batches: int = 60, rounds: int = 3,
                output: str = "float", progress: bool = True) -> dict:
    """One folder against itself split in two and mixed 50/50: the cost of mixing."""
    first, second = split_folder(folder)
    parts = {"even": (image.train(first, output=output), 0.5), "odd": (image.train(second, output=output), 0.5)}
    return bench_mix(parts, single=image.train(folder, output=output), placement=placement, batch_size=batch_size,
                     batches=batches, rounds=rounds, progress=progress)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="an ImageFolder (e.g. from `feedline make-data images`)")
    parser.add_argument("--placement", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", choices=("float", "uint8"), default="float")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    result = bench_split(args.folder, placement=args.placement, batch_size=args.batch_size, batches=args.batches,
                         rounds=args.rounds, output=args.output)
    print_result(result, args.json)


if __name__ == "__main__":
    main()
