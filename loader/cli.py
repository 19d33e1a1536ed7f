"""The ``feedline`` command: make-data, bench, plan."""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path

IMAGE_PIPELINES = ("image-train", "image-val")
PIPELINES = IMAGE_PIPELINES + ("criteo",)


def _int_at_least(minimum: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value
    return parse


_positive_int = _int_at_least(1, "a positive integer")
_non_negative_int = _int_at_least(0, "an integer >= 0")


def _trainer_step(text: str) -> float | str:
    """``--trainer-step-ms``: a positive, finite number of milliseconds, or ``auto``."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of milliseconds > 0 or 'auto', got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number of milliseconds > 0 or 'auto', got {text!r}")
    return value


def _existing_path(text: str) -> str:
    """An existing path, or webdataset shards named by a pattern (braces or glob characters) that match."""
    if Path(text).exists():
        return text
    from ..pipelines.shard_patterns import has_braces, has_glob, shard_paths
    if has_braces(text) or has_glob(text):
        try:
            shard_paths(text)
        except (FileNotFoundError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text
    raise argparse.ArgumentTypeError(f"{text!r} does not exist")


def _existing_folder(text: str) -> str:
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not an existing folder")
    return text


def _json_path(text: str) -> str:
    parent = Path(text).resolve().parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: folder {str(parent)!r} does not exist")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="feedline", description="Input pipelines that keep accelerators fed.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log placement decisions (INFO)")
    sub = parser.add_subparsers(dest="command", required=True)

    make = sub.add_parser("make-data", help="write a synthetic dataset")
    kinds = make.add_subparsers(dest="kind", required=True)
    images = kinds.add_parser("images", help="photo-like JPEGs (plus a few grayscale and PNG) in ImageFolder layout "
                                             "or webdataset shards")
    images.add_argument("--out", required=True, help="output directory (new, or empty; --force replaces a dataset "
                                                     "that make-data wrote there)")
    images.add_argument("--count", type=_positive_int, default=2000)
    images.add_argument("--classes", type=_positive_int, default=10)
    images.add_argument("--seed", type=_non_negative_int, default=0)
    images.add_argument("--format", choices=("folder", "webdataset"), default="folder",
                        help="an ImageFolder tree, or webdataset tar shards DIR/train-000000.tar, ... (default folder)")
    images.add_argument("--shard-size", type=_positive_int, default=None,
                        help="samples per shard with --format webdataset (default 1000)")
    criteo = kinds.add_parser("criteo", help="rows with Criteo-like statistics")
    criteo.add_argument("--out", required=True, help="output file (.tsv, .tsv.gz or .parquet)")
    criteo.add_argument("--rows", type=_positive_int, default=1_000_000)
    criteo.add_argument("--seed", type=_non_negative_int, default=0)
    criteo.add_argument("--format", choices=("tsv", "parquet"), default="tsv")
    for kind in (images, criteo):
        kind.add_argument("--force", action="store_true", help="replace what --out holds")

    bench = sub.add_parser("bench", help="throughput against a baseline, measured in the same run")
    what = bench.add_mutually_exclusive_group(required=True)
    what.add_argument("--pipeline", choices=PIPELINES)
    what.add_argument("--op", choices=("hash",), help="benchmark one op against memory-copy bandwidth")
    bench.add_argument("--data", type=_existing_path, help="dataset directory or file, or a shard pattern")
    bench.add_argument("--placement", default="cpu", choices=("cpu", "gpu", "auto"))
    bench.add_argument("--batch-size", type=_positive_int, default=None)
    bench.add_argument("--batches", type=_positive_int, default=None, help="timed batches after the warm-up")
    bench.add_argument("--output", choices=("float", "uint8"), default="float", help="image output format")
    bench.add_argument("--baseline", choices=("torchvision", "pandas", "torchrec", "pyarrow", "none"), default=None,
                       help="image pipelines: torchvision; criteo: pandas (default), torchrec (its conversion and "
                            "in-memory DLRM loader) or pyarrow (its CSV parse, and parse + NumPy features)")
    bench.add_argument("--rounds", type=_positive_int, default=None,
                       help="alternating rounds per contender (default 5; 2 with --placement auto)")
    bench.add_argument("--trainer-step-ms", type=_trainer_step, default=None, metavar="MS|auto",
                       help="also measure under a simulated trainer that sleeps MS per batch on the iterating "
                            "thread (auto: feedline's own batch time with no trainer)")
    bench.add_argument("--scratch", type=_existing_folder, metavar="DIR",
                       help="--baseline torchrec: where the conversions are written (a temporary folder in DIR, "
                            "removed after; default: the system's temporary folder)")
    bench.add_argument("--gil-profile", metavar="DIR", default=None,
                       help="--baseline torchrec/pyarrow: also sample each side's share of time holding the GIL "
                            "with py-spy (ptrace), keeping the raw stacks in DIR")
    bench.add_argument("--json", type=_json_path, metavar="PATH", help="also write the results as JSON")
    bench.add_argument("--no-progress", action="store_true")

    convert = sub.add_parser("convert", help="convert tabular text once to a table that reads without parsing")
    convert_kinds = convert.add_subparsers(dest="kind", required=True)
    convert_criteo = convert_kinds.add_parser("criteo", help="Criteo TSV (plain or gzip) -> a converted folder")
    convert_criteo.add_argument("inputs", nargs="+", type=_existing_path, metavar="IN",
                                help="TSV files (or glob patterns), in order")
    convert_criteo.add_argument("--out", required=True, help="output folder (new, or empty)")
    convert_criteo.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                                help="a bad line stops the conversion, or is left out and listed in skipped.tsv")
    convert_criteo.add_argument("--json", type=_json_path, metavar="PATH", help="also write the summary as JSON")
    convert_criteo.add_argument("--no-progress", action="store_true")

    plan = sub.add_parser("plan", help="profile a pipeline and show where each stage runs, and why")
    plan.add_argument("--pipeline", choices=PIPELINES, required=True)
    plan.add_argument("--data", type=_existing_path, required=True,
                      help="dataset directory or file, or a shard pattern")
    plan.add_argument("--batch-size", type=_positive_int, default=None)
    plan.add_argument("--batches", type=_positive_int, default=None, help="batches timed for the measured rate")
    plan.add_argument("--output", choices=("float", "uint8"), default="float", help="image output format")
    plan.add_argument("--placement", default="auto", choices=("auto", "cpu", "gpu"),
                      help="auto (default): profile and let the scheduler choose; cpu or gpu: the fixed plan, "
                           "with its measured rate")
    plan.add_argument("--json", type=_json_path, metavar="PATH", help="also write the plan as JSON")
    plan.add_argument("--no-progress", action="store_true")
    for command in (bench, plan):
        command.add_argument("--remote-workers", type=_positive_int, default=None, metavar="N",
                             help="add N Ray workers (pip install 'feedline[ray]'); the cluster is RAY_ADDRESS's "
                                  "or --ray-address, else a local one")
        command.add_argument("--cpus-per-worker", type=_positive_int, default=1)
        command.add_argument("--ray-address", default=None, metavar="HOST:PORT")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if args.command in ("bench", "plan") and args.remote_workers is None and (
            args.cpus_per_worker != 1 or args.ray_address is not None):
        parser.error("--cpus-per-worker and --ray-address apply with --remote-workers")
    try:
        if args.command == "make-data":
            if args.kind == "images" and args.shard_size is not None and args.format != "webdataset":
                parser.error("--shard-size applies to --format webdataset")
            result = _make_data(args)
        elif args.command == "convert":
            result = _convert(args)
        elif args.command == "plan":
            result = _plan(args)
            if args.json:
                Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
                print(f"wrote {args.json}")
            return 0
        else:
            result = _bench(parser, args)
    except (ValueError, TypeError, FileNotFoundError, NotADirectoryError, ConnectionError, ImportError,
            RuntimeError) as exc:
        print(f"feedline {args.command}: error: {exc}", file=sys.stderr)
        return 2
    print(format_table(result))
    if getattr(args, "json", None):
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def _convert(args) -> dict:
    import time

    from tqdm import tqdm

    from ..pipelines.criteo import criteo
    from .sources.convert import convert

    spec = criteo(args.inputs if len(args.inputs) > 1 else args.inputs[0], format="tsv", on_error=args.on_error)
    started = time.perf_counter()
    with tqdm(desc="convert", unit="row", unit_scale=True, disable=args.no_progress) as bar:
        result = convert(spec.source, args.out, progress=bar.update)
    result["seconds"] = round(time.perf_counter() - started, 2)
    result["read_with"] = f"criteo({args.out!r})"
    return result


def _make_data(args) -> dict:
    out = Path(args.out)
    if args.kind == "images":
        if out.is_dir() and any(out.iterdir()) and not args.force:
            raise ValueError(f"--out {args.out!r} is not empty; pass --force to replace a dataset that feedline "
                             f"make-data wrote there (nothing else is ever removed)")
        from ..benchmarks.data.images import DEFAULT_SHARD_SIZE, make_images
        return make_images(args.out, count=args.count, classes=args.classes, seed=args.seed, format=args.format,
                           shard_size=args.shard_size or DEFAULT_SHARD_SIZE)
    if out.is_dir():
        raise ValueError(f"--out {args.out!r} is a folder; make-data criteo writes a file (e.g. {args.out}/day_0.tsv)")
    if out.exists() and not args.force:
        raise ValueError(f"--out {args.out!r} exists; pass --force to replace it")
    from ..benchmarks.data.criteo import make_criteo
    return make_criteo(args.out, rows=args.rows, seed=args.seed, format=args.format)


def _bench(parser: argparse.ArgumentParser, args) -> dict:
    if args.op == "hash":
        if args.trainer_step_ms is not None:
            parser.error("--trainer-step-ms applies to --pipeline benchmarks, not to --op hash")
        from ..benchmarks.hash_bench import bench_hash
        return bench_hash()
    if args.data is None:
        parser.error(f"--pipeline {args.pipeline} needs --data (make one with `feedline make-data`)")
    if args.remote_workers is not None:
        if args.placement != "cpu" or args.baseline not in (None, "none"):
            parser.error("--remote-workers compares the CPU placement with and without the workers; it takes no "
                         "--placement or --baseline")
        from ..benchmarks.remote_bench import bench_remote
        criteo = args.pipeline == "criteo"
        return bench_remote(_spec(args.pipeline, args.data, args.output),
                            batch_size=args.batch_size or (8192 if criteo else 64),
                            remote_workers=args.remote_workers, cpus_per_worker=args.cpus_per_worker,
                            address=args.ray_address, batches=args.batches or (100 if criteo else 150),
                            rounds=args.rounds or 5, trainer_step_ms=args.trainer_step_ms,
                            progress=not args.no_progress)
    if args.baseline in ("torchrec", "pyarrow"):
        return _bench_criteo_baseline(parser, args)
    if args.scratch is not None or args.gil_profile is not None:
        parser.error("--scratch and --gil-profile apply to --baseline torchrec or pyarrow")
    if args.placement == "auto":
        if args.trainer_step_ms is not None:
            parser.error("--trainer-step-ms applies to a fixed --placement (cpu or gpu), not to --placement auto, "
                         "which compares placements")
        return _bench_auto(args)
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


def _bench_criteo_baseline(parser: argparse.ArgumentParser, args) -> dict:
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


def _spec(pipeline: str, data: str, output: str = "float"):
    if pipeline == "criteo":
        from ..pipelines.criteo import criteo
        return criteo(data)
    from ..pipelines import image
    return (image.train if pipeline == "image-train" else image.val)(data, output=output)


def _bench_auto(args) -> dict:
    from ..benchmarks.placement_bench import bench_placements, dali_default_image_loader

    spec = _spec(args.pipeline, args.data, args.output)
    batch_size = args.batch_size or (8192 if args.pipeline == "criteo" else 64)
    default = None
    if args.pipeline in IMAGE_PIPELINES:
        default = ("dali-default", dali_default_image_loader(args.data, train=args.pipeline == "image-train",
                                                             size=224, output=args.output, batch_size=batch_size))
    return bench_placements(spec, batch_size=batch_size, batches=args.batches or 20, rounds=args.rounds or 2,
                            default=default, progress=not args.no_progress)


def _plan(args) -> dict:
    import torch
    from tqdm import tqdm

    from .devices import gpu_available
    from .epochs import endless, measure_loader
    from .loader import Loader
    from .placement.report import format_plan

    spec = _spec(args.pipeline, args.data, args.output)
    batch_size = args.batch_size or (8192 if args.pipeline == "criteo" else 64)
    batches = args.batches or 10
    device = "cuda" if args.placement != "cpu" and gpu_available() else "cpu"
    remote = None
    if args.remote_workers is not None:
        from .runners.remote import RayWorkers
        remote = RayWorkers(args.remote_workers, args.cpus_per_worker, args.ray_address)
    auto = args.placement == "auto"
    loader = Loader(spec, batch_size, placement=args.placement, device=device, last_batch="drop", remote=remote)
    with tqdm(total=2 + batches, desc="plan", unit="step", disable=args.no_progress) as bar, _ticking(bar):
        try:
            stream = endless(lambda: loader)
            # with auto, the first iteration profiles and places; then a warm-up batch
            bar.set_description("plan: profiling and placing" if auto else "plan: first batch")
            next(stream)
            bar.update()
            bar.set_description("plan: warm-up batch")
            next(stream)
            bar.update()
            bar.set_description(f"plan: measuring {batches} batches")
            sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
            measured = measure_loader(lambda: _counted(stream, bar.update), batches, 0, sync=sync)["samples_per_s"]
            stream.close()
        finally:
            loader.close()
    report = loader.plan
    report["measured_samples_per_s"] = measured
    report["pipeline"] = spec.name
    report["batch_size"] = batch_size
    if auto:
        print(format_plan(report))
        print(f"profiling  {format_value(report['profile_seconds'])} s over {report['profile_samples']:,} samples")
    else:
        print(format_fixed_plan(report, args.placement))
    return report


def _counted(stream, tick):
    for batch in stream:
        tick()
        yield batch


class _ticking:
    """Redraws a progress bar twice a second, so that its clock runs during a long step (profiling)."""

    def __init__(self, bar, every_s: float = 0.5):
        import threading

        self.bar, self.every_s = bar, every_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.bar.refresh()

    def __enter__(self):
        if not self.bar.disable:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()


def format_fixed_plan(report: dict, placement: str) -> str:
    """A fixed placement's plan: each stage's backend, then the threads, prefetch and measured rate."""
    stages = report["stages"]
    width = max([len("stage")] + [len(stage) for stage in stages])
    lines = [f"{'stage':<{width}}  backend", f"{'-' * width}  -------"]
    lines += [f"{stage:<{width}}  {backend}" for stage, backend in stages.items()]
    threads = f"{report['threads']} CPU thread{'s' if report['threads'] > 1 else ''}"
    measured = report["measured_samples_per_s"]
    lines += ["", f"placement  {report['placement']} (cut {report['cut']}), {threads}, prefetch {report['prefetch']}, "
                  f"batch {report['batch_size']:,}",
              f"measured   {format_value(measured)} samples/s ({format_value(measured / report['batch_size'])} "
              f"batches/s)",
              f"why        fixed by --placement {placement} (--placement auto profiles every stage and chooses)"]
    for fallback in report.get("fallbacks", []):
        lines.append(f"fallback   {fallback}")
    return "\n".join(lines)


def format_value(value) -> str | None:
    """One number format for every table: integers with thousands separators; other numbers with three
    significant digits below 1,000 and as whole numbers with separators from 1,000; lists item by item; a dict of
    plain values as ``key value`` pairs. None for what a table row cannot show (nested containers)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        items = [format_value(v) if not isinstance(v, (list, tuple, dict)) else None for v in value]
        return None if None in items else "  ".join(items)
    if isinstance(value, dict):
        items = {k: format_value(v) if not isinstance(v, (list, tuple, dict)) else None for k, v in value.items()}
        return None if None in items.values() else ", ".join(f"{k} {v}" for k, v in items.items())
    return str(value)


def format_table(result: dict) -> str:
    """``key  value`` rows (:func:`format_value`), then the ``notes``, one per line."""
    rows = [(k, format_value(v)) for k, v in result.items() if k != "notes"]
    rows = [(k, v) for k, v in rows if v is not None]
    width = max((len(k) for k, _ in rows), default=0)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    notes = result.get("notes") or []
    if notes:
        lines += ["notes"] + [f"  - {note}" for note in notes]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
