"""``feedline bench``: throughput against a baseline, measured in the same run (the benchmarks do the work)."""
from __future__ import annotations

import argparse

from .arguments import (add_remote_workers, existing_folder, existing_path, json_path, positive_int,
                        trainer_step)
from .specs import IMAGE_PIPELINES, PIPELINES, pipeline_spec


def add_parser(sub) -> argparse.ArgumentParser:
    bench = sub.add_parser("bench", help="throughput against a baseline, measured in the same run")
    what = bench.add_mutually_exclusive_group(required=True)
    what.add_argument("--pipeline", choices=PIPELINES)
    what.add_argument("--op", choices=("hash",), help="benchmark one op against memory-copy bandwidth")
    bench.add_argument("--data", type=existing_path, help="dataset directory or file, or a shard pattern")
    bench.add_argument("--mix", type=mix_entry, nargs="+", metavar="NAME=PATH[:WEIGHT]",
                       help="bench a mix of these sources through --pipeline (weight 1 unless given), reporting "
                            "each source's delivered share; with --data, compared with that single source")
    bench.add_argument("--placement", default="cpu", choices=("cpu", "gpu", "auto"))
    bench.add_argument("--batch-size", type=positive_int, default=None)
    bench.add_argument("--batches", type=positive_int, default=None, help="timed batches after the warm-up")
    bench.add_argument("--output", choices=("float", "uint8"), default="float", help="image output format")
    bench.add_argument("--baseline", choices=("torchvision", "pandas", "torchrec", "pyarrow", "none"), default=None,
                       help="image pipelines: torchvision; criteo: pandas (default), torchrec (its conversion and "
                            "in-memory DLRM loader) or pyarrow (its CSV parse, and parse + NumPy features)")
    bench.add_argument("--rounds", type=positive_int, default=None,
                       help="alternating rounds per contender (default 5; with --placement auto at least 3, more "
                            "until every median is stable within 2%%, at most 8)")
    bench.add_argument("--trainer-step-ms", type=trainer_step, default=None, metavar="MS|auto",
                       help="also measure under a simulated trainer that sleeps MS per batch on the iterating "
                            "thread (auto: feedline's own batch time with no trainer)")
    bench.add_argument("--scratch", type=existing_folder, metavar="DIR",
                       help="--baseline torchrec: where the conversions are written (a temporary folder in DIR, "
                            "removed after; default: the system's temporary folder)")
    bench.add_argument("--gil-profile", metavar="DIR", default=None,
                       help="--baseline torchrec/pyarrow: also sample each side's share of time holding the GIL "
                            "with py-spy (ptrace), keeping the raw stacks in DIR")
    bench.add_argument("--json", type=json_path, metavar="PATH", help="also write the results as JSON")
    bench.add_argument("--no-progress", action="store_true")
    add_remote_workers(bench)
    return bench


def run(parser: argparse.ArgumentParser, args) -> dict:
    if args.op == "hash":
        if args.trainer_step_ms is not None:
            parser.error("--trainer-step-ms applies to --pipeline benchmarks, not to --op hash")
        from ..benchmarks.hash_bench import bench_hash
        return bench_hash()
    if args.mix is not None:
        return _mix(parser, args)
    if args.data is None:
        parser.error(f"--pipeline {args.pipeline} needs --data (make one with `feedline make-data`)")
    if args.remote_workers is not None:
        if args.placement != "cpu" or args.baseline not in (None, "none"):
            parser.error("--remote-workers compares the CPU placement with and without the workers; it takes no "
                         "--placement or --baseline")
        from ..benchmarks.remote_bench import bench_remote
        criteo = args.pipeline == "criteo"
        batch_size = args.batch_size or (8192 if criteo else 64)
        # the kernels the local loader and the workers run (the workers' compiles are not counted)
        return _warmed(lambda: bench_remote(
            pipeline_spec(args.pipeline, args.data, args.output), batch_size=batch_size,
            remote_workers=args.remote_workers, cpus_per_worker=args.cpus_per_worker, address=args.ray_address,
            batches=args.batches or (100 if criteo else 150), rounds=args.rounds or 5,
            trainer_step_ms=args.trainer_step_ms, progress=not args.no_progress),
            args.pipeline, args.data, batch_size=batch_size, placement="cpu", count_compiles=False)
    if args.baseline in ("torchrec", "pyarrow"):
        return _criteo_baseline(parser, args)
    if args.scratch is not None or args.gil_profile is not None:
        parser.error("--scratch and --gil-profile apply to --baseline torchrec or pyarrow")
    if args.placement == "auto":
        if args.trainer_step_ms is not None:
            parser.error("--trainer-step-ms applies to a fixed --placement (cpu or gpu), not to --placement auto, "
                         "which compares placements")
        return _placements(args)
    if args.pipeline in IMAGE_PIPELINES:
        if args.baseline == "pandas":
            parser.error("--baseline pandas applies to --pipeline criteo; image pipelines compare with torchvision")
        from ..benchmarks.image_bench import bench_image
        return bench_image(args.data, pipeline=args.pipeline, placement=args.placement,
                           batch_size=args.batch_size or 64, batches=args.batches or 75, rounds=args.rounds or 5,
                           output=args.output, baseline=None if args.baseline == "none" else "torchvision",
                           progress=not args.no_progress, trainer_step_ms=args.trainer_step_ms)
    if args.baseline == "torchvision":
        parser.error("--baseline torchvision applies to image pipelines; criteo compares with pandas, torchrec "
                     "or pyarrow")
    from ..benchmarks.criteo_bench import bench_criteo
    return bench_criteo(args.data, batch_size=args.batch_size or 8192, batches=args.batches,
                        placement=args.placement, baseline=args.baseline != "none",
                        trainer_step_ms=args.trainer_step_ms, rounds=args.rounds or 5,
                        progress=not args.no_progress)


def mix_entry(text: str) -> tuple[str, str, float]:
    """``NAME=PATH`` or ``NAME=PATH:WEIGHT`` (a PATH may hold ``:``; a last part that is a number is the weight)."""
    name, equals, rest = text.partition("=")
    if not equals or not name or not rest:
        raise argparse.ArgumentTypeError(f"a --mix source is NAME=PATH or NAME=PATH:WEIGHT, got {text!r}")
    path, weight = rest, 1.0
    head, colon, tail = rest.rpartition(":")
    if colon:
        try:
            path, weight = head, float(tail)
        except ValueError:
            pass
    return name, existing_path(path), weight


def _mix(parser: argparse.ArgumentParser, args) -> dict:
    if args.baseline not in (None, "none") or args.remote_workers is not None or args.placement == "auto" \
            or args.trainer_step_ms is not None:
        parser.error("--mix compares the mix with its single --data source (if given); it takes no --baseline, "
                     "--remote-workers, --trainer-step-ms or --placement auto")
    names = [name for name, _, _ in args.mix]
    if len(set(names)) != len(names) or len(names) < 2:
        parser.error(f"--mix needs two or more sources of distinct names, got {names}")
    from ..benchmarks.mix_bench import bench_mix
    parts = {name: (pipeline_spec(args.pipeline, path, args.output), weight) for name, path, weight in args.mix}
    batch_size = args.batch_size or (8192 if args.pipeline == "criteo" else 64)
    return _warmed(lambda: bench_mix(
        parts, single=pipeline_spec(args.pipeline, args.data, args.output) if args.data else None,
        placement=args.placement, batch_size=batch_size, batches=args.batches or 60, rounds=args.rounds or 3,
        progress=not args.no_progress),
        args.pipeline, [path for _, path, _ in args.mix] + ([args.data] if args.data else []),
        batch_size=batch_size, placement=args.placement)


def _criteo_baseline(parser: argparse.ArgumentParser, args) -> dict:
    name = f"--baseline {args.baseline}"
    if args.pipeline != "criteo":
        parser.error(f"{name} applies to --pipeline criteo; image pipelines compare with torchvision")
    if args.placement != "cpu":
        parser.error(f"{name} compares CPU loaders (TorchRec's and pyarrow's run on the CPU); it takes no "
                     f"--placement {args.placement}")
    if args.trainer_step_ms is not None or args.batches is not None:
        parser.error(f"{name} times whole epochs with no trainer; --trainer-step-ms and --batches apply to "
                     f"--baseline pandas or none")
    from ..benchmarks.criteo_compare import bench_criteo_baseline
    return bench_criteo_baseline(args.data, args.baseline, batch_size=args.batch_size or 8192,
                                 rounds=args.rounds or 5, scratch=args.scratch, gil_profile=args.gil_profile,
                                 progress=not args.no_progress)


def _placements(args) -> dict:
    from ..benchmarks.placement_bench import bench_placements, dali_default_image_loader

    spec = pipeline_spec(args.pipeline, args.data, args.output)
    batch_size = args.batch_size or (8192 if args.pipeline == "criteo" else 64)
    default = None
    if args.pipeline in IMAGE_PIPELINES:
        default = ("dali-default", dali_default_image_loader(args.data, train=args.pipeline == "image-train",
                                                             size=224, output=args.output, batch_size=batch_size))
    # the auto Loader's profile and run, and the static CPU placements: what a Loader placed "auto" reads
    return _warmed(lambda: bench_placements(spec, batch_size=batch_size, batches=args.batches or 20,
                                            rounds=args.rounds or 3, default=default, progress=not args.no_progress),
                   args.pipeline, args.data, batch_size=batch_size, placement="auto")


def _warmed(bench, pipeline: str, data, *, batch_size: int, placement: str, count_compiles: bool = True) -> dict:
    """``bench()`` after, for criteo, the numba kernels its Loaders (last batch dropped, the table cache kept or
    not) run over ``data`` (one path or several) are compiled in a process of their own; image pipelines run
    no numba kernels."""
    if pipeline != "criteo":
        return bench()
    from ..benchmarks import kernel_warmup
    return kernel_warmup.warmed_run(bench, data, ("loader_cache_on", "loader_cache_off"), batch_size=batch_size,
                                    table_size=None, placement=placement, last_batch="drop",
                                    count_compiles=count_compiles)
