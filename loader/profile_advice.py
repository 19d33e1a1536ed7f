"""What a profile concludes from the stage costs: where each stage runs now and its share of the time, the
bottleneck, every placement's throughput as the scheduler predicts it, and one recommendation with its gain.

The predictions are the scheduler's own model (``placement.scheduler``) fed with the profiled costs, this
machine's cores and GPU, and no trainer load: they predict the loader's capacity, which the profile measures
beside them for the current placement.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..pipelines.imaging.normalize import Normalize
from .devices import available_cores, gpu_available
from .placement.monitors import NoGpu, NvmlGpuMonitor
from .placement.measurements import Measurements, Resources
from .placement.model import Candidate, PlacementModel
from .placement.profiler import Profile as StageProfile
from .placement.scheduler import Scheduler

TRANSFER = "host-to-device"
WORTH = 1.10           # a gain under the scheduler's deadband is not worth recommending
KEEPS_UP_WAIT = 0.05   # a trainer waiting less than this share of its time is fed
ALTERNATIVES = 3       # other kinds of change listed after the recommendation


@dataclass(frozen=True)
class Model:
    placements: PlacementModel
    measurements: Measurements
    current: Candidate | None     # the current placement, predicted; None where it cannot be
    why_not_current: str | None


def model(spec, costs: StageProfile, *, batch_size: int, device, cut: int, threads: int) -> Model:
    """The model of this machine now (its cores, its GPU as NVML reads it) with the profiled costs."""
    on_gpu = getattr(device, "type", "cpu") == "cuda" and gpu_available()
    monitor = NvmlGpuMonitor.create(device.index or 0) if on_gpu else NoGpu()
    try:
        reading = monitor.sample()
    finally:
        monitor.close()
    resources = Resources(cores=available_cores(), trainer_cpu_cores_busy=0.0, gpu=reading,
                          h2d_bytes_per_s=costs.h2d_bytes_per_s)
    measurements = Measurements(costs.costs, costs.source_bytes_per_sample, resources, batch=costs.batch_costs)
    return model_of(spec, measurements, batch_size=batch_size, on_gpu=on_gpu, cut=cut, threads=threads)


def model_of(spec, measurements: Measurements, *, batch_size: int, on_gpu: bool, cut: int, threads: int) -> Model:
    """The scheduler's own model (with its settings: the GPU memory reserve) over ``measurements``."""
    placements = Scheduler(spec, spec.valid_cuts(), batch_size=batch_size, output_device="gpu" if on_gpu else "cpu",
                           max_threads=max(measurements.resources.cores, threads)).model
    current, why = _predict(placements, cut, threads, measurements)
    return Model(placements, measurements, current, why)


def _predict(placements: PlacementModel, cut: int, threads: int, m: Measurements
             ) -> tuple[Candidate | None, str | None]:
    """(cut, threads) predicted where it can run, else (None, why not)."""
    if placements.uses_gpu(cut) and m.resources.gpu is None:
        return None, "needs a GPU (none is used here)"
    candidate = placements.one(cut, threads, m)
    if candidate.prediction is None or candidate.why_not is not None:
        return None, candidate.why_not or "cannot be predicted"
    return candidate, None


def stage_rows(spec, m: Model, cut: int) -> list[dict[str, Any]]:
    """Each stage where it runs at ``cut`` (and the copy to the GPU), its time per sample there and its share."""
    rows = []
    for i, (stage, cost) in enumerate(zip(spec.stages, m.measurements.costs)):
        backend = "cpu" if i < cut else "gpu"
        seconds = cost.cpu_s_per_sample if backend == "cpu" else cost.gpu_s_per_sample
        rows.append({"stage": stage.name, "backend": backend, "ms_per_sample": 1000.0 * (seconds or 0.0),
                     "cpu_ms_per_sample": _ms(cost.cpu_s_per_sample), "gpu_ms_per_sample": _ms(cost.gpu_s_per_sample),
                     "blocked_ms_per_sample": 1000.0 * cost.blocked_s_per_sample if backend == "cpu" else 0.0,
                     "bytes_out_per_sample": cost.bytes_out_per_sample})
    if m.current is not None and m.current.prediction.transfer_s_per_sample > 0:
        rows.append({"stage": TRANSFER, "backend": "pcie",
                     "ms_per_sample": 1000.0 * m.current.prediction.transfer_s_per_sample,
                     "cpu_ms_per_sample": None, "gpu_ms_per_sample": None, "blocked_ms_per_sample": 0.0,
                     "bytes_out_per_sample": 0.0})
    total = sum(r["ms_per_sample"] for r in rows) or 1.0
    for r in rows:
        r["share"] = r["ms_per_sample"] / total
    return rows


def bottleneck(rows: list[dict], m: Model) -> dict[str, Any]:
    """The stage that takes the most time on the resource that bounds the current placement."""
    resource = m.current.prediction.bottleneck if m.current is not None else "cpu"
    on = {"cpu": ("cpu",), "thread": ("cpu",), "gpu": ("gpu",), "transfer": ("pcie",)}[resource]
    candidates = [r for r in rows if r["backend"] in on] or rows
    top = max(candidates, key=lambda r: r["ms_per_sample"])
    return {"stage": top["stage"], "backend": top["backend"], "share": top["share"], "resource": resource,
            "ms_per_sample": top["ms_per_sample"]}


def placements(spec, m: Model, cut: int, threads: int, measured_samples_per_s: float) -> list[dict[str, Any]]:
    """Every valid placement with the thread count that serves it best, and the current one as it runs."""
    rows = []
    cores = m.measurements.resources.cores
    for c in spec.valid_cuts():
        counts = sorted({threads, *range(1, cores + 1)}) if c != cut else [threads]
        plans = [(t, *_predict(m.placements, c, t, m.measurements)) for t in counts]
        feasible = [(t, p) for t, p, why in plans if p is not None]
        row = {"placement": spec.describe_cut(c), "cut": c, "current": c == cut}
        if feasible:
            t, p = max(feasible, key=lambda tp: (tp[1].prediction.samples_per_s, -tp[0]))
            row.update(threads=t, predicted_samples_per_s=p.prediction.samples_per_s, bound_by=p.prediction.bottleneck,
                       why_not=None, stage_ms_per_sample=_stacked(spec, m, c, p))
        else:
            row.update(threads=threads, predicted_samples_per_s=None, bound_by=None,
                       why_not=next((why for _, _, why in plans if why), "cannot run here"), stage_ms_per_sample=None)
        row["measured_samples_per_s"] = measured_samples_per_s if c == cut else None
        rows.append(row)
    return rows


def _stacked(spec, m: Model, cut: int, plan: Candidate) -> dict[str, float]:
    """Each stage's time per sample where ``cut`` runs it, and the copy to the GPU (ms)."""
    out = {stage.name: 1000.0 * ((cost.cpu_s_per_sample if i < cut else cost.gpu_s_per_sample) or 0.0)
           for i, (stage, cost) in enumerate(zip(spec.stages, m.measurements.costs))}
    out[TRANSFER] = 1000.0 * plan.prediction.transfer_s_per_sample
    return out


def recommend(spec, m: Model, rows: list[dict], bottleneck_row: dict, *, cut: int, threads: int,
              wait_share: float | None, text_table: bool) -> dict[str, Any]:
    """One recommendation, in words, with its predicted gain (x current capacity; "up to" where it is a bound)."""
    if wait_share is not None and wait_share < KEEPS_UP_WAIT:
        return _none(f"the loader keeps up: the trainer waits {wait_share:.0%} of its time for data")
    if m.current is None:
        return _none("the current placement cannot be predicted here; see the placements above")
    options = _moves(spec, m, cut, threads) + _savings(spec, m, rows, bottleneck_row, threads, text_table)
    worth = [o for o in options if o[2] >= WORTH]
    if not worth:
        return _none(f"no change is predicted to gain {WORTH - 1:.0%} or more")
    # concrete changes the model predicts come before bounds of what removing work could give
    ranked = sorted(worth, key=lambda o: (not o[3], o[2]), reverse=True)
    best = {**_option(*ranked[0]), "alternatives": []}
    seen = {ranked[0][0]}
    for option in ranked[1:]:
        if option[0] not in seen and len(best["alternatives"]) < ALTERNATIVES:
            seen.add(option[0])
            best["alternatives"].append(_option(*option))
    return best


def _option(action: str, words: str, gain: float, bound: bool) -> dict[str, Any]:
    return {"action": action, "words": words, "predicted_gain": gain, "bound": bound}


def _none(words: str) -> dict[str, Any]:
    return {**_option("none", words, 1.0, False), "alternatives": []}


def _moves(spec, m: Model, cut: int, threads: int) -> list[tuple[str, str, float, bool]]:
    """Other placements and thread counts, with the model's gain over the current one."""
    base = m.current.prediction.samples_per_s
    options = []
    for c in spec.valid_cuts():
        for t in range(1, m.measurements.resources.cores + 1):
            other, _ = _predict(m.placements, c, t, m.measurements)
            if other is None or (c, t) == (cut, threads):
                continue
            gain = other.prediction.samples_per_s / base
            if c != cut:
                words = f"placement={spec.describe_cut(c)!r}" + (f", num_threads={t}" if t != threads else "")
                options.append(("placement", f"use {words}", gain, False))
            else:
                options.append(("threads", f"use num_threads={t}", gain, False))
    return options


def _savings(spec, m: Model, rows: list[dict], top: dict, threads: int,
             text_table: bool) -> list[tuple[str, str, float, bool]]:
    """Work taken away or added elsewhere: uint8 output, a converted table, remote workers, a cheaper stage."""
    pred = m.current.prediction
    slowest = max(pred.cpu_s_per_sample, pred.thread_s_per_sample, pred.gpu_s_per_sample, pred.transfer_s_per_sample)
    options = []
    last = spec.stages[-1]
    if isinstance(last, Normalize):
        norm = next(r for r in rows if r["stage"] == last.name)
        after = _without(pred, norm["backend"], norm["ms_per_sample"] / 1000, transfer=pred.transfer_s_per_sample / 4)
        options.append(("output", 'use output="uint8" and normalise on the trainer\'s device (a quarter of the '
                                  'bytes, no normalize stage)', slowest / max(after, 1e-12), False))
    if pred.bottleneck in ("cpu", "thread"):
        first = rows[0]
        if text_table and first["backend"] == "cpu" and top["stage"] == first["stage"]:
            rest = max(pred.cpu_core_s_per_sample - first["ms_per_sample"] / 1000, 1e-12)
            options.append(("convert", f"convert the text table once (`feedline convert`): {first['stage']} is "
                                       f"{first['share']:.0%} of the time", pred.cpu_core_s_per_sample / rest, True))
        if pred.bottleneck == "thread" or threads >= m.measurements.resources.free_cores:
            per_core = 1.0 / pred.cpu_core_s_per_sample
            base = pred.samples_per_s
            worker = min(threads * per_core, 1.0 / max(pred.thread_s_per_sample, 1e-12))  # its own batch thread
            options.append(("remote", f"add remote CPU workers (RayWorkers): each core adds about {per_core:,.0f} "
                                      f"samples/s; one worker of {threads} cores", (base + worker) / base, True))
    if top["stage"] != TRANSFER and not any(o[0] == "convert" for o in options):
        after = _without(pred, top["backend"], top["ms_per_sample"] / 1000)
        options.append(("stage", f"make stage {top['stage']!r} cheaper: it is {top['share']:.0%} of the time "
                                 f"({_us(top['ms_per_sample'])} us per sample on the {top['backend'].upper()}); "
                                 f"the gain is the bound with it free", slowest / max(after, 1e-12), True))
    return options


def _without(pred, backend: str, seconds: float, transfer: float | None = None) -> float:
    """The slowest resource's seconds per sample with ``seconds`` of a stage on ``backend`` taken away."""
    cpu_s, gpu_s, thread_s = pred.cpu_s_per_sample, pred.gpu_s_per_sample, pred.thread_s_per_sample
    if backend == "cpu" and pred.cpu_core_s_per_sample > 0:
        cpu_s *= max(0.0, 1 - seconds / pred.cpu_core_s_per_sample)
    if backend == "cpu":  # a bound: as if the stage ran on the batch thread, which it may not
        thread_s = max(0.0, thread_s - seconds)
    elif backend == "gpu" and pred.gpu_busy_s_per_sample > 0:
        gpu_s *= max(0.0, 1 - seconds / pred.gpu_busy_s_per_sample)
    return max(cpu_s, gpu_s, thread_s, pred.transfer_s_per_sample if transfer is None else transfer)


def _us(ms: float) -> str:
    us = 1000.0 * ms
    return f"{us:,.0f}" if us >= 1000 else f"{us:.3g}"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000.0 * seconds


def cache_change(before: dict | None, after: dict | None) -> str | None:
    """Words for a cache whose state changed while the capacity was measured (decided, filled, dropped), else
    None: the measured rate then mixes two states, while the stage costs are those the profile measured."""
    if before is None or after is None or before == after:
        return None

    def state(c: dict) -> str:
        held = f", {c['samples_held']:,} samples held" if "samples_held" in c else ""
        return f"{'in use' if c.get('use') else 'not in use'}{held}"

    return (f"cache changed while the capacity was measured ({state(before)} -> {state(after)}): the measured rate "
            f"mixes the two states; the stage costs and predictions are as profiled, with the cache as it was then; "
            f"profile again once an epoch has run (or with cache='off') to compare like with like")
