"""A placement decision and the measurements behind it, as a table for people (``feedline plan``) and as JSON-able
data."""
from __future__ import annotations

from ...pipelines.image import infer_types
from ...pipelines.image_sources import FileList, ImageFolder, WebDataset
from ...pipelines.spec import PipelineSpec
from ...pipelines.stage import Backend
from ..runners import image_graph
from .decision import PlacementDecision
from .measurements import Measurements
from .units import format_bytes, format_ms, text_columns

COLUMNS = ("stage", "CPU ms/batch", "GPU ms/batch", "bytes out/sample", "backend", "reason")


def _check(decision: PlacementDecision, measurements: Measurements) -> None:
    if not isinstance(decision, PlacementDecision):
        raise TypeError(f"decision must be a PlacementDecision, got {type(decision).__name__}")
    if not isinstance(measurements, Measurements):
        raise TypeError(f"measurements must be Measurements, got {type(measurements).__name__}")
    missing = [s.stage for s in decision.stages if s.stage not in {c.stage for c in measurements.costs}]
    if missing:
        raise ValueError(f"measurements have no cost for stages {missing} of the decision")


def _ms_per_batch(seconds_per_sample: float | None, batch_size: int) -> float | None:
    return None if seconds_per_sample is None else seconds_per_sample * batch_size * 1000.0


def decision_dict(decision: PlacementDecision, measurements: Measurements,
                  measured_samples_per_s: float | None = None) -> dict:
    """Everything the table shows, in plain types (``json.dumps`` takes it as is). ``measured_samples_per_s``
    defaults to the measurements' own."""
    _check(decision, measurements)
    costs = {c.stage: c for c in measurements.costs}
    res = measurements.resources
    measured = measurements.samples_per_s if measured_samples_per_s is None else float(measured_samples_per_s)
    p = decision.prediction
    return {
        "placement": decision.placement,
        "cut": decision.cut,
        "threads": decision.threads,
        "prefetch": decision.prefetch,
        "batch_size": decision.batch_size,
        "feasible": decision.feasible,
        "predicted_samples_per_s": p.samples_per_s,
        "measured_samples_per_s": measured,
        "bottleneck": p.bottleneck,
        "seconds_per_sample": {"cpu": p.cpu_s_per_sample, "gpu": p.gpu_s_per_sample,
                               "transfer": p.transfer_s_per_sample},
        "gpu": None if res.gpu is None else {
            "trainer_busy_fraction": res.trainer_gpu_busy_fraction,
            "memory_free_bytes": res.gpu.memory_free_bytes,
            "memory_total_bytes": res.gpu.memory_total_bytes,
            "plan_memory_bytes": p.gpu_memory_bytes,
        },
        "cores": res.cores,
        "trainer_cpu_cores_busy": res.trainer_cpu_cores_busy,
        "reason": decision.reason,
        "stages": [{
            "stage": s.stage,
            "cpu_ms_per_batch": _ms_per_batch(costs[s.stage].cpu_s_per_sample, decision.batch_size),
            "gpu_ms_per_batch": _ms_per_batch(costs[s.stage].gpu_s_per_sample, decision.batch_size),
            "bytes_out_per_sample": costs[s.stage].bytes_out_per_sample,
            "backend": s.backend.value,
            "reason": s.reason,
        } for s in decision.stages],
    }


def decision_table(decision: PlacementDecision, measurements: Measurements,
                   measured_samples_per_s: float | None = None) -> str:
    """One row per stage (its cost on each backend, bytes out, where it runs and why), then the predicted
    and, when known, measured throughput."""
    return format_decision(decision_dict(decision, measurements, measured_samples_per_s))


def format_decision(data: dict) -> str:
    """``decision_table`` from the data of ``decision_dict`` (also what ``Loader.plan`` holds under auto
    placement)."""
    no_gpu = data["gpu"] is None

    def ms(value: float | None, gpu: bool) -> str:
        if gpu and no_gpu:
            return "no GPU"
        return "-" if value is None else format_ms(value)

    rows = [COLUMNS] + [(s["stage"], ms(s["cpu_ms_per_batch"], False), ms(s["gpu_ms_per_batch"], True),
                         format_bytes(s["bytes_out_per_sample"]), s["backend"], s["reason"])
                        for s in data["stages"]]
    lines = text_columns(rows, {1, 2, 3}, free_last=True)

    predicted = data["predicted_samples_per_s"]
    threads = f"{data['threads']} CPU thread{'s' if data['threads'] > 1 else ''}"
    lines += ["", f"placement  {data['placement']} (cut {data['cut']}), {threads}, prefetch {data['prefetch']}, "
                  f"batch {data['batch_size']}" + ("" if data["feasible"] else "  [cannot run now]"),
              f"predicted  {predicted:,.0f} samples/s ({predicted / data['batch_size']:,.1f} batches/s), "
              f"bound by {data['bottleneck']}"]
    measured = data["measured_samples_per_s"]
    if measured is not None:
        lines.append(f"measured   {measured:,.0f} samples/s ({measured / predicted:.0%} of predicted)")
    if no_gpu:
        lines.append("GPU        none on this machine")
    else:
        g = data["gpu"]
        lines.append(f"GPU        {g['trainer_busy_fraction']:.0%} busy with training, "
                     f"{format_bytes(g['memory_free_bytes'])} of {format_bytes(g['memory_total_bytes'])} free")
    lines.append(f"CPU        {data['cores']} cores, trainer uses {data['trainer_cpu_cores_busy']:.1f}")
    lines.append(f"why        {data['reason']}")
    remote = data.get("remote")
    if remote is not None:
        lines.append(f"remote     {remote['used_workers']} of {remote['workers']} Ray worker(s) of "
                     f"{remote['cpus_per_worker']} CPU(s) {remote['why']}")
    return "\n".join(lines)


_ENGINE_WORDS = {"host": "host (Python)", "dali:cpu": "DALI", "dali:mixed": "DALI `mixed` (nvJPEG)",
                 "dali:gpu": "DALI", "torch:cpu": "torch", "torch:cuda": "torch"}


def stage_table(spec: PipelineSpec) -> str:
    """A Markdown table of ``spec``'s stages: what each does and what runs it on the CPU and on the GPU,
    generated from the stage declarations and the engine rules of the runners."""
    engines = _engines(spec)
    rows = ["| stage | does | CPU | GPU |", "| --- | --- | --- | --- |"]
    for stage in spec.stages:
        cpu, gpu = engines[stage.name]
        rows.append(f"| `{stage.name}` | {stage.describe()} | {cpu} | {gpu} |")
    return "\n".join(rows)


def _engines(spec: PipelineSpec) -> dict[str, tuple[str, str]]:
    if not isinstance(spec.source, (ImageFolder, FileList, WebDataset)):
        return {s.name: ("NumPy" if s.runs_on(Backend.CPU) else "-", "CuPy" if s.runs_on(Backend.GPU) else "-")
                for s in spec.stages}
    types = infer_types(spec.stages[1:])
    on_cpu = image_graph.assign_engines(spec, spec.all_cpu, types).engines
    on_gpu = image_graph.assign_engines(spec, min(spec.valid_cuts()), types).engines
    return {s.name: (_ENGINE_WORDS[on_cpu[s.name]] if s.runs_on(Backend.CPU) else "-",
                     _ENGINE_WORDS[on_gpu[s.name]] if s.runs_on(Backend.GPU) else "-") for s in spec.stages}
