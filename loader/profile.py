"""Where a loader's time goes: ``profile_loader(loader)`` (``loader.profile()``) profiles every stage where it runs,
times the loader as its trainer sees it, and says what bounds it and what would help.

A profile holds, for the current placement: each stage's time per sample and where it ran (CPU: one thread's
CPU time, as the placement profiler measures it for the scheduler; GPU: synchronised time), the copy to the GPU,
the bottleneck stage with its share; the measured capacity (no trainer), and under a trainer step the delivered
rate, the trainer's waits and the batches already queued when it asked; the headroom (the trainer loop fed from
batches already made); every placement's throughput as the scheduler predicts it; and one recommendation.
"""
from __future__ import annotations

import json
import math
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..pipelines.validate import positive_int
from . import profile_advice as advice
from .placement.profiler import buffer_batches, profile as profile_stages
from .profile_run import measure, measure_handoff, warmup_batches

PROFILE_BATCHES = 5   # batches the per-stage profile times on one thread (after one warm-up batch)
_last: "weakref.WeakKeyDictionary[Any, Profile]" = weakref.WeakKeyDictionary()


@dataclass
class Profile:
    pipeline: str
    batch_size: int
    device: str
    placement: dict[str, Any]          # placement (name), cut, threads, prefetch, chosen_by (auto, fixed)
    stages: list[dict[str, Any]]       # stage, backend, ms_per_sample, share, cpu/gpu ms, bytes_out_per_sample
    bottleneck: dict[str, Any]         # stage, backend, share, resource (cpu, gpu, transfer), ms_per_sample
    placements: list[dict[str, Any]]   # placement, cut, threads, predicted/measured_samples_per_s, bound_by, why_not
    measured: dict[str, Any]           # capacity and, under a trainer step, delivered, waits, queue
    headroom_samples_per_s: float | None
    recommendation: dict[str, Any]     # action, words, predicted_gain, bound, alternatives (the same, each)
    timeline: list[list[float]]        # per batch: asked, got, step done (s); under the trainer when there is one
    profile_samples: int
    notes: list[str] = field(default_factory=list)
    batch_costs: dict[str, float] = field(default_factory=dict)  # ms per batch beyond the stages (model's inputs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(_finite(self.to_dict()), indent=2) + "\n"

    def table(self) -> str:
        from .profile_table import format_profile
        return format_profile(self)

    def plot(self, path) -> Path:
        """The picture (matplotlib, ``pip install 'feedline[plot]'``): stacked stage times per placement, and
        the timeline of batches waited for and taken from the queue."""
        from .profile_plot import plot_profile
        return plot_profile(self, Path(path))


def profile_loader(loader, *, batches: int = 40, trainer_step_ms: float | str | None = None,
                   train_step: Callable[[dict], Any] | None = None, warmup: int | None = None) -> Profile:
    """Profile ``loader`` (a ``feedline.loader.Loader``) between iterations; its position is given back as it
    was. ``batches``: batches timed per measurement. ``trainer_step_ms``: a simulated trainer step (milliseconds,
    or ``"auto"``: the loader's own batch time); ``train_step``: your own step, called with each batch. With
    either, the profile adds the delivered rate, the trainer's waits and the headroom. ``warmup``: batches taken
    untimed before the capacity is timed (default ``profile_run.warmup_batches``: as many as are timed, at least
    the Loader's read-ahead and a table's first two shuffle buffer-fulls), so that the rate measured is the steady
    state's that the model predicts, not the Loader's start."""
    if not all(hasattr(loader, name) for name in ("pipeline", "config", "state_dict", "load_state_dict")):
        raise TypeError(f"loader must be a feedline.loader.Loader, got {type(loader).__name__}")
    positive_int("batches", batches)
    if warmup is None:
        warmup = warmup_batches(batches, loader.prefetch, buffer_batches(_orders(loader), loader.batch_size),
                                len(loader))
    measured = measure(loader, batches=batches, trainer_step_ms=trainer_step_ms, train_step=train_step,
                       warmup=warmup)
    spec = loader.pipeline
    config = loader.config
    cut, threads = loader.cut, loader.num_threads
    costs = profile_stages(spec, config, _runners(loader), _orders(loader),
                           gpu=getattr(loader.device, "type", "cpu") == "cuda", batches=PROFILE_BATCHES,
                           delivery_s=measure_handoff())
    model = advice.model(spec, costs, batch_size=loader.batch_size, device=loader.device, cut=cut, threads=threads)
    rows = advice.stage_rows(spec, model, cut)
    top = advice.bottleneck(rows, model)
    capacity = measured.capacity.samples_per_s
    loaded = measured.loaded
    source_format = getattr(getattr(spec.source, "format", None), "value", None)
    notes = []
    if getattr(loader, "remote", None) is not None:
        notes.append("remote workers make batches too: the stage times are the local placement's")
    predicted = model.current.prediction.samples_per_s if model.current is not None else None
    if predicted is not None and capacity < 0.5 * predicted:
        notes.append(f"measured {capacity / predicted:.0%} of the predicted rate: time the profile does not see "
                     f"(cores busy with other work, waits outside the timed stages)")
    cache = loader.plan.get("cache")
    if cache is not None:
        notes.append(f"cache: {cache['reason']}")  # whether the deterministic prefix is cached, and why
    changed = advice.cache_change(*measured.cache)
    if changed:
        notes.append(changed)
    profile = Profile(
        pipeline=spec.name, batch_size=loader.batch_size, device=str(loader.device),
        placement={"placement": spec.describe_cut(cut), "cut": cut, "threads": threads, "prefetch": loader.prefetch,
                   "chosen_by": "auto" if isinstance(loader.plan.get("history"), list) else "fixed"},
        stages=rows, bottleneck=top,
        placements=advice.placements(spec, model, cut, threads, capacity),
        measured=_measured(measured, model),
        headroom_samples_per_s=measured.headroom.samples_per_s if measured.headroom else None,
        recommendation=advice.recommend(spec, model, rows, top, cut=cut, threads=threads,
                                        wait_share=loaded.wait_share if loaded else None,
                                        text_table=source_format in ("tsv", "csv")),
        timeline=[list(t) for t in (loaded or measured.capacity).timeline],
        profile_samples=costs.samples, notes=notes,
        batch_costs={name: 1000.0 * getattr(costs.batch_costs, field)
                     for name, field in (("forming_ms", "cpu_s"), ("batch_thread_ms", "thread_s"),
                                         ("hand_off_ms", "delivery_s"), ("copies_ms", "transfer_s"))})
    _last[loader] = profile
    return profile


def last_profile(loader) -> Profile | None:
    """The latest profile of ``loader`` made in this process, if any."""
    try:
        return _last.get(loader)
    except TypeError:  # not weakly referable
        return None


def _measured(measured, model) -> dict[str, Any]:
    capacity, loaded = measured.capacity, measured.loaded
    out: dict[str, Any] = {
        "capacity_samples_per_s": capacity.samples_per_s,
        "cache_before": measured.cache[0], "cache_after": measured.cache[1],
        "predicted_samples_per_s": model.current.prediction.samples_per_s if model.current is not None else None,
        "batches": capacity.batches,
        "trainer_step_ms": measured.step_ms if loaded is not None else None,
        "delivered_samples_per_s": None, "trainer_wait_share": None, "mean_wait_ms": None,
        "queued_share": None,
    }
    if loaded is not None:
        waited = [w for w in loaded.waits if w >= 0.001]
        out.update(trainer_step_ms=1000.0 * loaded.step_s, delivered_samples_per_s=loaded.samples_per_s,
                   trainer_wait_share=loaded.wait_share, queued_share=loaded.ready_share,
                   mean_wait_ms=1000.0 * sum(waited) / len(waited) if waited else 0.0)
    return out


def _runners(loader):
    """A runner for a configuration over the Loader's opened source."""
    make = getattr(loader, "make_runner", None) or getattr(loader, "_local_runner")
    return make


def _orders(loader):
    """The Loader's source order for profiling, apart from its epochs."""
    return getattr(loader, "probe_order", None) or getattr(loader, "_probe_order")


def _finite(value):
    """JSON has no infinity: a rate with nothing timed is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
