"""``feedline plan``: profile a pipeline and show where each stage runs, and why."""
from __future__ import annotations

import argparse

from .arguments import add_remote_workers, existing_path, json_path, positive_int
from .specs import PIPELINES, batch_size_of, device_for, pipeline_spec
from .tables import format_value


def add_parser(sub) -> argparse.ArgumentParser:
    plan = sub.add_parser("plan", help="profile a pipeline and show where each stage runs, and why")
    plan.add_argument("--pipeline", choices=PIPELINES, required=True)
    plan.add_argument("--data", type=existing_path, required=True,
                      help="dataset directory or file, or a shard pattern")
    plan.add_argument("--batch-size", type=positive_int, default=None)
    plan.add_argument("--batches", type=positive_int, default=None, help="batches timed for the measured rate")
    plan.add_argument("--output", choices=("float", "uint8"), default="float", help="image output format")
    plan.add_argument("--placement", default="auto", choices=("auto", "cpu", "gpu"),
                      help="auto (default): profile and let the scheduler choose; cpu or gpu: the fixed plan, "
                           "with its measured rate")
    plan.add_argument("--cache", choices=("auto", "on", "off"), default="auto",
                      help="cache the pipeline's deterministic prefix: auto (default: where measured to pay), on, off")
    plan.add_argument("--cache-dir", default=None, metavar="DIR",
                      help="keep the cache in this folder (reused by later runs) instead of RAM")
    plan.add_argument("--json", type=json_path, metavar="PATH", help="also write the plan as JSON")
    plan.add_argument("--no-progress", action="store_true")
    add_remote_workers(plan)
    return plan


def run(parser: argparse.ArgumentParser, args) -> dict:
    """Measures and prints the plan; returns it (for ``--json``)."""
    import torch
    from tqdm import tqdm

    from ..benchmarks.trainer import counted
    from ..loader.epochs import endless, measure_loader
    from ..loader.loader import Loader
    from ..loader.placement.report import format_decision

    spec = pipeline_spec(args.pipeline, args.data, args.output)
    batch_size = batch_size_of(args.pipeline, args.batch_size)
    batches = args.batches or 10
    device = device_for(args.placement)
    remote = None
    if args.remote_workers is not None:
        from ..loader.runners.remote import RayWorkers
        remote = RayWorkers(args.remote_workers, args.cpus_per_worker, args.ray_address)
    auto = args.placement == "auto"
    from ..loader.cache_policy import CacheSettings

    cache = CacheSettings(args.cache, directory=args.cache_dir)
    loader = Loader(spec, batch_size, placement=args.placement, device=device, last_batch="drop", remote=remote,
                    cache=cache)
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
            measured = measure_loader(lambda: counted(stream, bar.update), batches, 0, sync=sync)["samples_per_s"]
            stream.close()
        finally:
            loader.close()
    report = loader.plan
    report["measured_samples_per_s"] = measured
    report["pipeline"] = spec.name
    report["batch_size"] = batch_size
    if auto:
        print(format_decision(report))
        print(f"profiling  {format_value(report['profile_seconds'])} s over {report['profile_samples']:,} samples")
    else:
        print(format_fixed_placement(report, args.placement))
    print(format_cache(report["cache"]))
    return report


def format_cache(cache: dict) -> str:
    """The cache's line: what is kept, where, and the decision with its reason."""
    kept = f"{cache['kind']} in {cache['where']}, " if "kind" in cache else ""
    return f"cache      {kept}{cache['reason']}"


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


def format_fixed_placement(report: dict, placement: str) -> str:
    """A fixed placement's report: each stage's backend, then the threads, prefetch and measured rate."""
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
