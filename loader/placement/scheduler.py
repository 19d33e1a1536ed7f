"""Choosing the cut (which stages run on the GPU), the CPU thread count and the prefetch depth.

Pure and deterministic: every input arrives as ``Measurements`` and time only through the injected clock,
so tests drive it with synthetic readings.

The model, for a candidate (cut, threads), all per sample:
  cpu      = sum of the CPU stages' costs / min(threads, free cores)
             free cores = cores - trainer's busy cores, at least MIN_CPU_SHARE
  gpu      = sum of the GPU stages' costs (on an idle GPU) / (1 - trainer's GPU busy fraction)
  transfer = max(bytes to the GPU / h2d bandwidth, bytes back to the host / d2h bandwidth)
             bytes to the GPU: what stages after the cut consume from before it, plus, when batches are
             delivered on the GPU and there is one, the outputs produced before the cut (for the all-CPU cut:
             the outputs);
             bytes back: the outputs made on the GPU when batches are delivered on the CPU.
  samples/s = 1 / max(cpu, gpu, transfer)
GPU cuts are infeasible without a GPU, with the GPU >= GPU_SATURATED busy, or when their memory
(batch bytes x (prefetch + 1) + reserve) exceeds free memory plus what the pipeline already holds.
Candidates are ranked by samples/s capped at DEMAND_HEADROOM x the trainer's demand (batch size / its
step time) where that is measured; ties go to the later cut (GPU left to the trainer), then fewer threads.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

from ...pipelines.spec import PipelineSpec
from ...pipelines.stage import Backend, Stage
from ..errors import PlacementError
from .monitors import GpuReading, WaitReading

GPU_SATURATED = 0.95
MIN_CPU_SHARE = 0.5           # cores the OS still gives the pipeline on a fully busy machine
DEFAULT_H2D_BYTES_PER_S = 12e9  # PCIe 3.0 x16 as measured in practice
DEMAND_HEADROOM = 1.25
MIN_WAIT_BATCHES = 8          # fewer measured batches than this say nothing about the trainer
NOISE_SIGMAS = 4.0            # how many standard errors of noise a move's mean gain must clear
NOISE_WINDOW_CONFIRMS = 16    # noise is estimated over this many times `confirm` updates
STABLE_WINDOW_CONFIRMS = 4    # a plan moved to must have been able to run for this many times `confirm`
SOURCE = -1                   # producer index of the pipeline's source
_TIE = 1e-9


def _number(name: str, value, low: float = 0.0, allow_none: bool = False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
        raise ValueError(f"{name} must be a finite number >= {low}, got {value!r}")
    return float(value)


def _count(name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


@dataclass(frozen=True)
class StageCost:
    """Measured cost of one stage: core-seconds per sample on one CPU thread, seconds per sample on an idle
    GPU (None where it cannot run or was not measured), and bytes it outputs per sample."""

    stage: str
    cpu_s_per_sample: float | None
    gpu_s_per_sample: float | None
    bytes_out_per_sample: float

    def __post_init__(self) -> None:
        if not isinstance(self.stage, str) or not self.stage:
            raise ValueError(f"stage must be a non-empty stage name, got {self.stage!r}")
        _number("cpu_s_per_sample", self.cpu_s_per_sample, allow_none=True)
        _number("gpu_s_per_sample", self.gpu_s_per_sample, allow_none=True)
        _number("bytes_out_per_sample", self.bytes_out_per_sample)


@dataclass(frozen=True)
class Resources:
    """What the trainer leaves to the pipeline. ``trainer_*`` exclude the pipeline's own load (see
    ``trainer_load``). ``gpu_memory_needed_per_batch`` maps a cut to measured GPU bytes per batch; cuts
    missing from it are estimated from the stages' bytes. ``gpu_memory_held_bytes`` is what the pipeline
    holds on the GPU now, free to it when it re-plans."""

    cores: int
    trainer_cpu_cores_busy: float
    gpu: GpuReading | None
    trainer_gpu_busy_fraction: float = 0.0
    h2d_bytes_per_s: float = DEFAULT_H2D_BYTES_PER_S
    d2h_bytes_per_s: float | None = None
    gpu_memory_needed_per_batch: Mapping[int, float] | None = None
    gpu_memory_held_bytes: float = 0.0

    def __post_init__(self) -> None:
        _count("cores", self.cores)
        _number("trainer_cpu_cores_busy", self.trainer_cpu_cores_busy)
        if self.gpu is not None and not isinstance(self.gpu, GpuReading):
            raise TypeError(f"gpu must be a GpuReading or None, got {type(self.gpu).__name__}")
        busy = _number("trainer_gpu_busy_fraction", self.trainer_gpu_busy_fraction)
        if busy > 1.0:
            raise ValueError(f"trainer_gpu_busy_fraction must be in [0, 1], got {busy!r}")
        if _number("h2d_bytes_per_s", self.h2d_bytes_per_s) == 0.0:
            raise ValueError("h2d_bytes_per_s must be > 0")
        if _number("d2h_bytes_per_s", self.d2h_bytes_per_s, allow_none=True) == 0.0:
            raise ValueError("d2h_bytes_per_s must be > 0 or None (same as h2d)")
        _number("gpu_memory_held_bytes", self.gpu_memory_held_bytes)
        if self.gpu_memory_needed_per_batch is not None:
            needed = dict(self.gpu_memory_needed_per_batch)
            for cut, value in needed.items():
                _count("gpu_memory_needed_per_batch key (a cut)", cut, low=0)
                _number(f"gpu_memory_needed_per_batch[{cut}]", value)
            object.__setattr__(self, "gpu_memory_needed_per_batch", MappingProxyType(needed))

    @property
    def free_cores(self) -> float:
        return max(self.cores - self.trainer_cpu_cores_busy, MIN_CPU_SHARE)


@dataclass(frozen=True)
class Measurements:
    """One set of inputs to a decision. ``samples_per_s`` is the measured throughput of the current plan."""

    costs: tuple[StageCost, ...]
    source_bytes_per_sample: float
    resources: Resources
    wait: WaitReading | None = None
    samples_per_s: float | None = None

    def __post_init__(self) -> None:
        costs = tuple(self.costs)
        if not all(isinstance(c, StageCost) for c in costs):
            raise TypeError("costs must hold StageCost values")
        object.__setattr__(self, "costs", costs)
        _number("source_bytes_per_sample", self.source_bytes_per_sample)
        if not isinstance(self.resources, Resources):
            raise TypeError(f"resources must be a Resources, got {type(self.resources).__name__}")
        if self.wait is not None and not isinstance(self.wait, WaitReading):
            raise TypeError(f"wait must be a WaitReading or None, got {type(self.wait).__name__}")
        _number("samples_per_s", self.samples_per_s, allow_none=True)

    def demand_samples_per_s(self, batch_size: int) -> float | None:
        """Samples per second the trainer would take if it never waited; None until measured."""
        w = self.wait
        if w is None or w.batches < MIN_WAIT_BATCHES or w.mean_step_s <= 0.0:
            return None
        return batch_size / w.mean_step_s


@dataclass(frozen=True)
class Prediction:
    """Seconds per sample of each resource (cpu: on its threads; gpu: on the GPU time the trainer leaves),
    the resulting throughput, and the load the pipeline adds: CPU core-seconds and idle-GPU seconds per
    sample, and GPU bytes it needs."""

    cpu_s_per_sample: float
    gpu_s_per_sample: float
    transfer_s_per_sample: float
    samples_per_s: float
    bottleneck: str
    cpu_core_s_per_sample: float
    gpu_busy_s_per_sample: float
    gpu_memory_bytes: float


@dataclass(frozen=True)
class StagePlacement:
    stage: str
    backend: Backend
    reason: str


@dataclass(frozen=True)
class Plan:
    cut: int
    threads: int
    prefetch: int
    placement: str
    batch_size: int
    prediction: Prediction
    stages: tuple[StagePlacement, ...]
    reason: str
    feasible: bool = True

    @property
    def samples_per_s(self) -> float:
        return self.prediction.samples_per_s

    @property
    def key(self) -> tuple[int, int]:
        return self.cut, self.threads


@dataclass(frozen=True)
class Move:
    time: float
    old: Plan | None
    new: Plan
    reason: str


def prefetch_depth(samples_per_s: float, demand: float | None, wait: WaitReading | None) -> int:
    """2 batches, unless the pipeline outpaces the trainer and the trainer's waits still jitter: then 3
    (jitter >= 0.1) or 4 (>= 0.3), jitter being the stdev of its wait over its mean step. A pipeline slower
    than its trainer gets 2: its queue stays empty whatever its depth."""
    if demand is None or wait is None or samples_per_s < demand:
        return 2
    jitter = wait.stdev_wait_s / wait.mean_step_s
    return 2 if jitter < 0.1 else 3 if jitter < 0.3 else 4


def trainer_load(process_cores_busy: float, gpu: GpuReading | None, plan: Plan,
                 samples_per_s: float) -> tuple[float, float]:
    """(trainer's busy cores, trainer's GPU busy fraction): what the readings show less the pipeline's own
    load at ``samples_per_s`` under ``plan``, for ``Resources``."""
    cores = max(0.0, process_cores_busy - plan.prediction.cpu_core_s_per_sample * samples_per_s)
    if gpu is None:
        return cores, 0.0
    return cores, min(1.0, max(0.0, gpu.utilization - plan.prediction.gpu_busy_s_per_sample * samples_per_s))


def format_ms(ms: float) -> str:
    return f"{ms:.2g}" if ms < 10 else f"{ms:,.0f}"


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


@dataclass(frozen=True)
class _Candidate:
    cut: int
    threads: int
    prediction: Prediction | None   # None: a stage has no cost on the backend this cut gives it
    why_not: str | None             # why it cannot run now; None when it can
    score: float
    prefetch: int

    @property
    def key(self) -> tuple[int, int]:
        return self.cut, self.threads


@dataclass(frozen=True)
class _Record:
    """What one update saw; the last NOISE_WINDOW_CONFIRMS x confirm of them are kept."""

    scores: Mapping[tuple[int, int], float]   # of the candidates that can run
    fractions: tuple[float, ...]
    logs: tuple[float, ...]
    measured: float | None
    trainer_cycle_s: float | None


def _robust_noise(values: Sequence[float]) -> float:
    """Standard deviation of the update-to-update noise in ``values``, from their successive differences
    (so a slow drift is not noise) with each difference capped at four times the median one (so a step
    change in conditions is not noise either)."""
    finite = [v for v in values if math.isfinite(v)]
    diffs = [abs(b - a) for a, b in zip(finite, finite[1:])]
    if len(diffs) < 2:
        return 0.0
    cap = 4.0 * 1.4826 * statistics.median(diffs)
    return math.sqrt(statistics.fmean(min(d, cap) ** 2 for d in diffs) / 2.0)


def _ratio(record: _Record, key: tuple[int, int], current: tuple[int, int]) -> float:
    """How much better ``key`` scored than the current plan; infinite where the current plan could not run."""
    base = record.scores.get(current, 0.0)
    return record.scores[key] / base if base > 0 else math.inf


def _log(x: float, floor: float = 1e-12) -> float:
    return math.log(max(x, floor))


class Scheduler:
    """``decide()`` gives the best plan for one set of measurements; ``update()`` re-plans online.

    ``update()`` moves to another plan only when all of these hold:
      * at least ``confirm`` updates and ``min_interval_s`` have passed since the last move;
      * the other plan could run at every one of the last STABLE_WINDOW_CONFIRMS x ``confirm`` updates;
      * its predicted gain over the current plan beat ``deadband`` at each of the last ``confirm``
        updates, and its mean (log) gain over them beat the deadband by NOISE_SIGMAS standard errors of
        the measured noise: the update-to-update scatter of that gain, of the measured throughput and
        of the trainer's time per batch, whichever is largest;
      * if it was left within the last ``recent_intervals`` x ``min_interval_s``, conditions (resources,
        costs, the trainer's demand; medians over the last ``confirm`` updates) have since moved by
        more than the deadband.
    A current plan that can no longer run (GPU saturated, memory gone) counts as an infinite gain.
    """

    def __init__(self, pipeline: PipelineSpec | Sequence[Stage], valid_cuts: Sequence[int] | None = None, *,
                 batch_size: int, output_device: Backend | str = Backend.CPU, deadband: float = 0.10,
                 min_interval_s: float = 60.0, confirm: int = 5, recent_intervals: int = 10,
                 max_threads: int | None = None, gpu_memory_reserve_bytes: float = 512 * 2 ** 20,
                 clock: Callable[[], float] = time.monotonic):
        if isinstance(pipeline, PipelineSpec):
            stages, outputs = pipeline.stages, pipeline.outputs
            cuts = pipeline.valid_cuts() if valid_cuts is None else valid_cuts
            self.name = pipeline.name
        else:
            stages = tuple(pipeline) if isinstance(pipeline, (list, tuple)) else None
            if not stages or not all(isinstance(s, Stage) for s in stages):
                raise TypeError("pipeline must be a PipelineSpec or a non-empty list of Stage")
            outputs = stages[-1].produces
            cuts = valid_cuts if valid_cuts is not None else [
                c for c in range(len(stages) + 1)
                if all(s.runs_on(Backend.CPU) for s in stages[:c]) and all(s.runs_on(Backend.GPU) for s in stages[c:])]
            self.name = "pipeline"
        self.stages: tuple[Stage, ...] = tuple(stages)
        n = len(self.stages)
        cuts = sorted(set(cuts))
        if not cuts or not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= n for c in cuts):
            raise ValueError(f"valid_cuts must be a non-empty list of integers in [0, {n}], got {valid_cuts!r}")
        self.valid_cuts: tuple[int, ...] = tuple(cuts)
        self.batch_size = _count("batch_size", batch_size)
        try:
            self.output_device = output_device if isinstance(output_device, Backend) else Backend(output_device)
        except ValueError:
            raise ValueError(f"output_device must be 'cpu' or 'gpu', got {output_device!r}") from None
        self.deadband = _number("deadband", deadband)
        if not 0.10 <= self.deadband < 1.0:
            raise ValueError(f"deadband must be in [0.10, 1): gains under 10% are measurement noise, got {deadband!r}")
        self.min_interval_s = _number("min_interval_s", min_interval_s)
        self.confirm = _count("confirm", confirm)
        self.recent_intervals = _count("recent_intervals", recent_intervals, low=0)
        self.max_threads = None if max_threads is None else _count("max_threads", max_threads)
        self.gpu_memory_reserve_bytes = _number("gpu_memory_reserve_bytes", gpu_memory_reserve_bytes)
        if not callable(clock):
            raise TypeError(f"clock must be callable (e.g. time.monotonic), got {type(clock).__name__}")
        self._clock = clock
        self._graph(outputs)
        self.current: Plan | None = None
        self.history: list[Move] = []
        self._records: list[_Record] = []   # the last NOISE_WINDOW_CONFIRMS x confirm updates
        self._since_move = 0
        self._last_move_at: float | None = None
        self._left: dict[tuple[int, int], tuple[float, tuple[float, ...], tuple[float, ...]]] = {}

    # ---- the data each cut moves -------------------------------------------------------------------
    def _graph(self, outputs: Sequence[str]) -> None:
        producer: dict[str, int] = {}
        edges: list[tuple[int, int]] = []     # (producer, consumer)
        for j, stage in enumerate(self.stages):
            edges += [(producer.get(name, SOURCE), j) for name in stage.consumes]
            producer.update({name: j for name in stage.produces})
        n = len(self.stages)
        # Source-made outputs (labels) are small next to images and features, and are left out.
        self._output_producers = frozenset(producer[o] for o in outputs if o in producer)
        self._crossing = [frozenset(p for p, j in edges if p < c <= j) for c in range(n + 1)]

    def _bytes(self, producers, costs: Sequence[StageCost], source_bytes: float) -> float:
        return sum(source_bytes if p == SOURCE else costs[p].bytes_out_per_sample for p in producers)

    # ---- the model ---------------------------------------------------------------------------------
    def _ordered_costs(self, m: Measurements) -> list[StageCost]:
        by_name = {c.stage: c for c in m.costs}
        names = [s.name for s in self.stages]
        missing = [name for name in names if name not in by_name]
        extra = [name for name in by_name if name not in names]
        if missing or extra or len(m.costs) != len(by_name):
            raise ValueError(f"measurements must give one StageCost per stage of {names}; "
                             f"missing {missing}, unknown {extra}")
        return [by_name[name] for name in names]

    def _evaluate(self, cut: int, thread_counts: Sequence[int], m: Measurements, costs: Sequence[StageCost],
                  demand: float | None) -> list[_Candidate]:
        """The candidates (cut, t) for each t in ``thread_counts``."""
        n, res = len(self.stages), m.resources
        cpu_costs = [c.cpu_s_per_sample for c in costs[:cut]]
        gpu_costs = [c.gpu_s_per_sample for c in costs[cut:]]
        if None in cpu_costs or None in gpu_costs:
            stage = next(c.stage for c in costs[:cut] if c.cpu_s_per_sample is None) if None in cpu_costs else \
                next(c.stage for c in costs[cut:] if c.gpu_s_per_sample is None)
            return [_Candidate(cut, t, None, f"{stage} has no measured cost there", 0.0, 2) for t in thread_counts]
        core_s, gpu_busy_s = sum(cpu_costs), sum(gpu_costs)
        gpu_s = gpu_busy_s / max(1.0 - res.trainer_gpu_busy_fraction, 1e-6) if cut < n else 0.0
        crossing = set(self._crossing[cut])
        back: set[int] = set()
        if res.gpu is not None and self.output_device is Backend.GPU:
            crossing |= {p for p in self._output_producers if p < cut}
        elif self.output_device is Backend.CPU:
            back = {p for p in self._output_producers if p >= cut}
        h2d = self._bytes(crossing, costs, m.source_bytes_per_sample)
        d2h = self._bytes(back, costs, m.source_bytes_per_sample)
        transfer_s = max(h2d / res.h2d_bytes_per_s, d2h / (res.d2h_bytes_per_s or res.h2d_bytes_per_s))
        per_batch = (res.gpu_memory_needed_per_batch or {}).get(cut)
        if per_batch is None:
            per_batch = self.batch_size * (self._bytes(self._crossing[cut], costs, m.source_bytes_per_sample)
                                           + sum(c.bytes_out_per_sample for c in costs[cut:]))
        gpu_blocked = None
        if cut < n:
            if res.gpu is None:
                gpu_blocked = "no GPU on this machine"
            elif res.trainer_gpu_busy_fraction >= GPU_SATURATED:
                gpu_blocked = f"GPU {res.trainer_gpu_busy_fraction:.0%} busy with training"
        available = res.gpu.memory_free_bytes + res.gpu_memory_held_bytes if res.gpu else 0.0
        candidates = []
        for threads in thread_counts:
            cpu_s = core_s / min(threads, res.free_cores)
            slowest = max(cpu_s, gpu_s, transfer_s, 1e-12)
            bottleneck = "cpu" if slowest == cpu_s else "gpu" if slowest == gpu_s else "transfer"
            samples_per_s = 1.0 / slowest
            prefetch = prefetch_depth(samples_per_s, demand, m.wait)
            memory = per_batch * (prefetch + 1) + self.gpu_memory_reserve_bytes if cut < n else 0.0
            why_not = gpu_blocked
            if why_not is None and memory > available and cut < n:
                why_not = f"it needs {format_bytes(memory)} of GPU memory, {format_bytes(available)} free"
            score = 0.0 if why_not else min(samples_per_s, demand * DEMAND_HEADROOM) if demand else samples_per_s
            prediction = Prediction(cpu_s, gpu_s, transfer_s, samples_per_s, bottleneck, core_s, gpu_busy_s, memory)
            candidates.append(_Candidate(cut, threads, prediction, why_not, score, prefetch))
        return candidates

    def _thread_counts(self, m: Measurements) -> range:
        top = m.resources.cores if self.max_threads is None else min(self.max_threads, m.resources.cores)
        return range(1, top + 1)

    def _candidates(self, m: Measurements) -> list[_Candidate]:
        costs = self._ordered_costs(m)
        demand = m.demand_samples_per_s(self.batch_size)
        threads = self._thread_counts(m)
        return [c for cut in self.valid_cuts for c in self._evaluate(cut, threads, m, costs, demand)]

    def _one(self, cut: int, threads: int, m: Measurements) -> _Candidate:
        return self._evaluate(cut, [threads], m, self._ordered_costs(m), m.demand_samples_per_s(self.batch_size))[0]

    @staticmethod
    def _best(candidates: Sequence[_Candidate]) -> _Candidate | None:
        feasible = [c for c in candidates if c.why_not is None]
        if not feasible:
            return None
        top = max(c.score for c in feasible)
        return max((c for c in feasible if c.score >= top * (1 - _TIE)), key=lambda c: (c.cut, -c.threads))

    # ---- explaining --------------------------------------------------------------------------------
    def describe_cut(self, cut: int) -> str:
        if cut >= len(self.stages):
            return "cpu"
        if cut == self.valid_cuts[0]:
            return "gpu"
        return f"gpu-from-{self.stages[cut].name}"

    def _plan(self, chosen: _Candidate, candidates: Sequence[_Candidate], m: Measurements) -> Plan:
        res, costs = m.resources, self._ordered_costs(m)
        per_batch_ms = 1000.0 * self.batch_size
        busy = res.trainer_gpu_busy_fraction
        demand = m.demand_samples_per_s(self.batch_size)
        sps = chosen.prediction.samples_per_s

        def per_batch(seconds: float | None) -> str:
            return "n/a" if seconds is None else f"{format_ms(seconds * per_batch_ms)} ms/batch"

        stages = []
        for i, (stage, cost) in enumerate(zip(self.stages, costs)):
            cpu, gpu = per_batch(cost.cpu_s_per_sample), per_batch(cost.gpu_s_per_sample)
            if i >= chosen.cut:
                cheaper_on_cpu = (cost.cpu_s_per_sample or 0) < (cost.gpu_s_per_sample or 0)
                note = "; data already on the GPU" if cheaper_on_cpu else ""
                reason = f"GPU: {gpu} vs CPU {cpu}; GPU {busy:.0%} busy{note}"
                stages.append(StagePlacement(stage.name, Backend.GPU, reason))
                continue
            moved = [c for c in candidates if c.cut <= i]
            if not moved or not stage.runs_on(Backend.GPU):
                reason = "CPU: runs only on the CPU"
            elif m.resources.gpu is None:
                reason = "CPU: no GPU on this machine"
            elif cost.gpu_s_per_sample is None:
                reason = "CPU: no GPU cost was measured"
            elif res.gpu is None:
                reason = "CPU: no GPU on this machine"
            elif busy >= GPU_SATURATED:
                reason = f"CPU: GPU {busy:.0%} busy with training"
            else:
                alt = self._best(moved)
                if alt is None:
                    blocked = max((c for c in moved if c.why_not), key=lambda c: c.cut)
                    reason = f"CPU: {cpu} vs GPU {gpu}; on the GPU {blocked.why_not}"
                elif alt.score >= chosen.score * (1 - _TIE):
                    reason = (f"CPU: {cpu} vs GPU {gpu}; either keeps up with the trainer "
                              f"({demand or 0:,.0f} samples/s), so the GPU is left to it")
                else:
                    reason = (f"CPU: {cpu} vs GPU {gpu}; with it on the GPU the best plan predicts "
                              f"{alt.prediction.samples_per_s:,.0f} samples/s, this one {sps:,.0f}")
            stages.append(StagePlacement(stage.name, Backend.CPU, reason))
        placement = self.describe_cut(chosen.cut)
        reason = f"{placement}: {sps:,.0f} samples/s predicted, bound by {chosen.prediction.bottleneck}"
        if chosen.prediction.cpu_core_s_per_sample > 0:
            reason += (f"; {chosen.threads} CPU thread{'s' if chosen.threads > 1 else ''} for "
                       f"{res.free_cores:.1f} free cores")
        gpu_cuts = [c for c in candidates if c.cut < len(self.stages)]
        if res.gpu is None:
            reason += "; no GPU on this machine"
        elif gpu_cuts and all(c.why_not for c in gpu_cuts):
            reason += f"; no GPU placement can run: {min(gpu_cuts, key=lambda c: c.cut).why_not}"
        others = [c for c in candidates if c.cut != chosen.cut]
        runner_up = self._best(others)
        if runner_up is not None:
            reason += (f"; next best {self.describe_cut(runner_up.cut)}: "
                       f"{runner_up.prediction.samples_per_s:,.0f} samples/s")
        if demand is not None:
            reason += f"; the trainer takes up to {demand:,.0f} samples/s"
        if chosen.why_not:
            reason += f"; cannot run now: {chosen.why_not}"
        return Plan(chosen.cut, chosen.threads, chosen.prefetch, placement, self.batch_size, chosen.prediction,
                    tuple(stages), reason, feasible=chosen.why_not is None)

    # ---- deciding ----------------------------------------------------------------------------------
    def decide(self, measurements: Measurements) -> Plan:
        """The best plan for these measurements; changes no state."""
        candidates = self._candidates(measurements)
        best = self._best(candidates)
        if best is None:
            why = sorted({f"{self.describe_cut(c.cut)}: {c.why_not}" for c in candidates})
            raise PlacementError(f"no placement of {self.name} can run here: " + "; ".join(why))
        return self._plan(best, candidates, measurements)

    def adopt(self, cut: int, threads: int, measurements: Measurements, reason: str = "set by the caller") -> Plan:
        """Make (cut, threads) the current plan without the deadband rules, e.g. the Loader's starting placement."""
        if cut not in self.valid_cuts:
            raise ValueError(f"cut must be one of {list(self.valid_cuts)}, got {cut!r}")
        _count("threads", threads)
        candidate = self._one(cut, threads, measurements)
        if candidate.prediction is None:
            raise ValueError(f"cut {cut} cannot be predicted: {candidate.why_not}")
        plan = self._plan(candidate, self._candidates(measurements), measurements)
        self._move(plan, reason)
        return plan

    def update(self, measurements: Measurements) -> Plan | None:
        """Feed one set of measurements; returns the new plan when it is time to move, else None.
        The first call adopts ``decide()``'s plan and returns it."""
        if self.current is None:
            plan = self.decide(measurements)
            self._move(plan, "initial plan")
            return plan
        now = self._clock()
        candidates = self._candidates(measurements)
        here = self.current.key
        scores = {c.key: c.score for c in candidates if c.why_not is None}
        if here not in {c.key for c in candidates}:   # more threads than this machine now has cores
            current = self._one(self.current.cut, self.current.threads, measurements)
            if current.why_not is None:
                scores[here] = current.score
        self._records.append(self._record(scores, measurements))
        del self._records[:-NOISE_WINDOW_CONFIRMS * self.confirm]
        self._since_move += 1
        if self._since_move < self.confirm or now - self._last_move_at < self.min_interval_s:
            return None
        window = self._records[-self.confirm:]
        # A plan that could not run at some recent update (a GPU hovering near saturation, free memory
        # near the need) is not moved to until it has run for the whole stability window.
        stable = self._records[-STABLE_WINDOW_CONFIRMS * self.confirm:]
        steady = set(window[-1].scores).intersection(*(r.scores.keys() for r in stable)) - {here}
        if not steady:
            return None
        worst = {k: min(_ratio(r, k, here) for r in window) for k in steady}
        target = max(steady, key=lambda k: (worst[k], sum(r.scores[k] for r in window), k[0], -k[1]))
        mean_log_gain = statistics.fmean(math.log(_ratio(r, target, here)) for r in window)
        noise = max(_robust_noise([math.log(_ratio(r, target, here)) for r in self._records
                                   if target in r.scores and here in r.scores]),
                    _robust_noise([_log(r.measured) for r in self._records if r.measured]),
                    _robust_noise([_log(r.trainer_cycle_s) for r in self._records if r.trainer_cycle_s]))
        required = math.log1p(self.deadband) + NOISE_SIGMAS * noise / math.sqrt(self.confirm)
        if worst[target] <= 1.0 + self.deadband or mean_log_gain <= required:
            return None
        fractions, logs = self._median_conditions(window)
        left = self._left.get(target)
        if left is not None and now - left[0] < self.recent_intervals * self.min_interval_s \
                and not self._changed(left[1], left[2], fractions, logs):
            return None
        plan = self._plan(next(c for c in candidates if c.key == target), candidates, measurements)
        gain = "the current plan cannot run" if math.isinf(mean_log_gain) else \
            f"mean predicted gain +{math.expm1(mean_log_gain):.0%} (needed +{math.expm1(required):.0%})"
        self._left[here] = (now, fractions, logs)
        self._move(plan, f"{gain} over the last {self.confirm} updates; {plan.reason}")
        return plan

    def _move(self, plan: Plan, reason: str) -> None:
        now = self._clock()
        self.history.append(Move(now, self.current, plan, reason))
        self.current = plan
        self._last_move_at = now
        self._since_move = 0

    # ---- conditions, for noise and for "changed since we left" -------------------------------------
    def _record(self, scores: Mapping[tuple[int, int], float], m: Measurements) -> _Record:
        res, costs = m.resources, self._ordered_costs(m)
        gpu = res.gpu
        fractions = (min(res.trainer_cpu_cores_busy / res.cores, 1.0),
                     res.trainer_gpu_busy_fraction if gpu else 1.0, 1.0 if gpu else 0.0)
        demand = m.demand_samples_per_s(self.batch_size)
        logs = (_log(gpu.memory_free_bytes + res.gpu_memory_held_bytes, 1.0) if gpu else 0.0,
                _log(res.h2d_bytes_per_s), _log(res.d2h_bytes_per_s or res.h2d_bytes_per_s),
                _log(demand) if demand else math.nan, _log(m.source_bytes_per_sample, 1.0),
                *(_log(x) if x is not None else math.nan
                  for c in costs for x in (c.cpu_s_per_sample, c.gpu_s_per_sample)),
                *(_log(c.bytes_out_per_sample, 1.0) for c in costs))
        cycle = (m.wait.mean_wait_s + m.wait.mean_step_s) if m.wait and m.wait.batches else None
        return _Record(MappingProxyType(dict(scores)), fractions, logs, m.samples_per_s, cycle)

    @staticmethod
    def _median_conditions(window: Sequence[_Record]) -> tuple[tuple[float, ...], tuple[float, ...]]:
        def med(values):
            finite = [v for v in values if not math.isnan(v)]
            return statistics.median(finite) if finite else math.nan
        return (tuple(med(col) for col in zip(*(r.fractions for r in window))),
                tuple(med(col) for col in zip(*(r.logs for r in window))))

    def _changed(self, fractions_then, logs_then, fractions_now, logs_now) -> bool:
        if any(abs(a - b) > self.deadband for a, b in zip(fractions_then, fractions_now)):
            return True
        limit = math.log1p(self.deadband)
        return any(abs(a - b) > limit for a, b in zip(logs_then, logs_now)
                   if not (math.isnan(a) or math.isnan(b)))
