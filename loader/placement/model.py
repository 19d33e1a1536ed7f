"""Predicting each candidate placement (cut, threads) from one set of measurements, ranking the candidates, and
explaining the chosen one stage by stage. Pure: the same measurements give the same candidates.

The model, for a candidate (cut, threads), all per sample (B: the batch size; "per batch" costs are
``Measurements.batch``, each divided by B):
  core     = the CPU stages' core seconds + forming per batch / B (all the CPU work of a sample), of which
  own      = min(the batch thread's CPU time per batch / B, core) runs on the batch thread whatever the thread
             count (an image pipeline's torch stages, reading and forming), and
  pool     = core - own on the ``threads`` worker threads (DALI's, the feature workers)
  cpu      = max(pool / min(threads, free cores), core / min(threads + 1, free cores)): the batch thread
             works beside the pool's threads, so with one worker thread two cores can be busy
             free cores = cores - trainer's busy cores, at least MIN_CPU_SHARE
  thread   = (the batch thread's CPU time per batch + the hand-off to the trainer per batch) / B
             + the CPU stages' blocked seconds (sleeping, waiting on I/O on the batch thread): one thread
             makes every batch, whatever the thread count
  gpu      = sum of the GPU stages' costs (on an idle GPU) / (1 - trainer's GPU busy fraction)
  transfer = max(bytes to the GPU / h2d bandwidth, bytes back to the host / d2h bandwidth)
             + the copies' fixed cost per batch / B where anything crosses
             bytes to the GPU: what stages after the cut consume from before it, plus, when batches are
             delivered on the GPU and there is one, the outputs produced before the cut (for the all-CPU cut:
             the outputs);
             bytes back: the outputs made on the GPU when batches are delivered on the CPU.
  samples/s = 1 / max(cpu, thread, gpu, transfer)
GPU cuts are infeasible without a GPU, with the GPU >= GPU_SATURATED busy, or when their memory
(batch bytes x (prefetch + 1) + reserve) exceeds free memory plus what the pipeline already holds.
Candidates are ranked by samples/s capped at DEMAND_HEADROOM x the trainer's demand (batch size / its
step time) where that is measured; ties go to the later cut (GPU left to the trainer), then fewer threads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ...pipelines.spec import PipelineSpec
from ...pipelines.stage import Backend, Stage
from ...pipelines.validate import finite_at_least, int_at_least
from .decision import PlacementDecision, Prediction, StagePlacement
from .measurements import Measurements, StageCost
from .monitors import WaitReading
from .units import format_bytes, format_ms

GPU_SATURATED = 0.95
DEMAND_HEADROOM = 1.25
SOURCE = -1                   # producer index of the pipeline's source
TIE = 1e-9                    # scores this close are equal


def prefetch_depth(samples_per_s: float, demand: float | None, wait: WaitReading | None) -> int:
    """2 batches, unless the pipeline outpaces the trainer and the trainer's waits still jitter: then 3
    (jitter >= 0.1) or 4 (>= 0.3), jitter being the stdev of its wait over its mean step. A pipeline slower
    than its trainer gets 2: its queue stays empty whatever its depth."""
    if demand is None or wait is None or samples_per_s < demand:
        return 2
    jitter = wait.stdev_wait_s / wait.mean_step_s
    return 2 if jitter < 0.1 else 3 if jitter < 0.3 else 4


@dataclass(frozen=True)
class Candidate:
    cut: int
    threads: int
    prediction: Prediction | None   # None: a stage has no cost on the backend this cut gives it
    why_not: str | None             # why it cannot run now; None when it can
    score: float
    prefetch: int

    @property
    def key(self) -> tuple[int, int]:
        return self.cut, self.threads


class PlacementModel:
    """The stages of one pipeline, the cuts it may take, and the prediction of each candidate."""

    def __init__(self, pipeline: PipelineSpec | Sequence[Stage], valid_cuts: Sequence[int] | None, *,
                 batch_size: int, output_device: Backend | str, max_threads: int | None,
                 gpu_memory_reserve_bytes: float):
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
        self.batch_size = int_at_least("batch_size", batch_size, 1)
        try:
            self.output_device = output_device if isinstance(output_device, Backend) else Backend(output_device)
        except ValueError:
            raise ValueError(f"output_device must be 'cpu' or 'gpu', got {output_device!r}") from None
        self.max_threads = None if max_threads is None else int_at_least("max_threads", max_threads, 1)
        self.gpu_memory_reserve_bytes = finite_at_least("gpu_memory_reserve_bytes", gpu_memory_reserve_bytes, 0.0)
        self._graph(outputs)

    def uses_gpu(self, cut: int) -> bool:
        """Whether ``cut`` puts any stage on the GPU."""
        return cut < len(self.stages)

    def describe_cut(self, cut: int) -> str:
        if not self.uses_gpu(cut):
            return "cpu"
        if cut == self.valid_cuts[0]:
            return "gpu"
        return f"gpu-from-{self.stages[cut].name}"

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

    # ---- the candidates ----------------------------------------------------------------------------
    def ordered_costs(self, m: Measurements) -> list[StageCost]:
        by_name = {c.stage: c for c in m.costs}
        names = [s.name for s in self.stages]
        missing = [name for name in names if name not in by_name]
        extra = [name for name in by_name if name not in names]
        if missing or extra or len(m.costs) != len(by_name):
            raise ValueError(f"measurements must give one StageCost per stage of {names}; "
                             f"missing {missing}, unknown {extra}")
        return [by_name[name] for name in names]

    def _evaluate(self, cut: int, thread_counts: Sequence[int], m: Measurements, costs: Sequence[StageCost],
                  demand: float | None) -> list[Candidate]:
        """The candidates (cut, t) for each t in ``thread_counts``."""
        res = m.resources
        cpu_costs = [c.cpu_s_per_sample for c in costs[:cut]]
        gpu_costs = [c.gpu_s_per_sample for c in costs[cut:]]
        if None in cpu_costs or None in gpu_costs:
            stage = next(c.stage for c in costs[:cut] if c.cpu_s_per_sample is None) if None in cpu_costs else \
                next(c.stage for c in costs[cut:] if c.gpu_s_per_sample is None)
            return [Candidate(cut, t, None, f"{stage} has no measured cost there", 0.0, 2) for t in thread_counts]
        per_batch_costs, b = m.batch, self.batch_size
        blocked_s = sum(c.blocked_s_per_sample for c in costs[:cut])
        core_s = sum(cpu_costs) - blocked_s + per_batch_costs.cpu_s / b
        thread_s = blocked_s + (per_batch_costs.thread_s + per_batch_costs.delivery_s) / b
        own_s = min(per_batch_costs.thread_s / b, core_s)  # measured at the all-CPU cut: at most this cut's work
        pool_s = core_s - own_s
        gpu_busy_s = sum(gpu_costs)
        on_gpu = self.uses_gpu(cut)
        gpu_s = gpu_busy_s / max(1.0 - res.trainer_gpu_busy_fraction, 1e-6) if on_gpu else 0.0
        crossing = set(self._crossing[cut])
        back: set[int] = set()
        if res.gpu is not None and self.output_device is Backend.GPU:
            crossing |= {p for p in self._output_producers if p < cut}
        elif self.output_device is Backend.CPU:
            back = {p for p in self._output_producers if p >= cut}
        h2d = self._bytes(crossing, costs, m.source_bytes_per_sample)
        d2h = self._bytes(back, costs, m.source_bytes_per_sample)
        transfer_s = max(h2d / res.h2d_bytes_per_s, d2h / (res.d2h_bytes_per_s or res.h2d_bytes_per_s))
        if h2d > 0 or d2h > 0:
            transfer_s += per_batch_costs.transfer_s / b
        per_batch = (res.gpu_memory_needed_per_batch or {}).get(cut)
        if per_batch is None:
            per_batch = self.batch_size * (self._bytes(self._crossing[cut], costs, m.source_bytes_per_sample)
                                           + sum(c.bytes_out_per_sample for c in costs[cut:]))
        gpu_blocked = None
        if on_gpu:
            if res.gpu is None:
                gpu_blocked = "no GPU on this machine"
            elif res.trainer_gpu_busy_fraction >= GPU_SATURATED:
                gpu_blocked = f"GPU {res.trainer_gpu_busy_fraction:.0%} busy with training"
        available = res.gpu.memory_free_bytes + res.gpu_memory_held_bytes if res.gpu else 0.0
        candidates = []
        for threads in thread_counts:
            cpu_s = max(pool_s / min(threads, res.free_cores), core_s / min(threads + 1, res.free_cores))
            slowest = max(cpu_s, thread_s, gpu_s, transfer_s, 1e-12)
            bottleneck = "cpu" if slowest == cpu_s else "thread" if slowest == thread_s else \
                "gpu" if slowest == gpu_s else "transfer"
            samples_per_s = 1.0 / slowest
            prefetch = prefetch_depth(samples_per_s, demand, m.wait)
            memory = per_batch * (prefetch + 1) + self.gpu_memory_reserve_bytes if on_gpu else 0.0
            why_not = gpu_blocked
            if why_not is None and memory > available and on_gpu:
                why_not = f"it needs {format_bytes(memory)} of GPU memory, {format_bytes(available)} free"
            score = 0.0 if why_not else min(samples_per_s, demand * DEMAND_HEADROOM) if demand else samples_per_s
            prediction = Prediction(cpu_s, gpu_s, transfer_s, samples_per_s, bottleneck, core_s, gpu_busy_s, memory,
                                    thread_s)
            candidates.append(Candidate(cut, threads, prediction, why_not, score, prefetch))
        return candidates

    def candidates(self, m: Measurements) -> list[Candidate]:
        """Every (cut, threads) this machine allows, predicted."""
        top = m.resources.cores if self.max_threads is None else min(self.max_threads, m.resources.cores)
        costs = self.ordered_costs(m)
        demand = m.demand_samples_per_s(self.batch_size)
        return [c for cut in self.valid_cuts for c in self._evaluate(cut, range(1, top + 1), m, costs, demand)]

    def one(self, cut: int, threads: int, m: Measurements) -> Candidate:
        return self._evaluate(cut, [threads], m, self.ordered_costs(m), m.demand_samples_per_s(self.batch_size))[0]

    @staticmethod
    def best(candidates: Sequence[Candidate]) -> Candidate | None:
        feasible = [c for c in candidates if c.why_not is None]
        if not feasible:
            return None
        top = max(c.score for c in feasible)
        return max((c for c in feasible if c.score >= top * (1 - TIE)), key=lambda c: (c.cut, -c.threads))

    # ---- explaining --------------------------------------------------------------------------------
    def explain(self, chosen: Candidate, candidates: Sequence[Candidate], m: Measurements) -> PlacementDecision:
        """``chosen`` as a decision, with the reason for each stage's backend and for the whole."""
        res, costs = m.resources, self.ordered_costs(m)
        demand = m.demand_samples_per_s(self.batch_size)
        sps = chosen.prediction.samples_per_s
        stages = [StagePlacement(stage.name, *self._stage_reason(i, stage, cost, chosen, candidates, m, demand))
                  for i, (stage, cost) in enumerate(zip(self.stages, costs))]
        placement = self.describe_cut(chosen.cut)
        reason = f"{placement}: {sps:,.0f} samples/s predicted, bound by {chosen.prediction.bottleneck}"
        if chosen.prediction.cpu_core_s_per_sample > 0:
            reason += (f"; {chosen.threads} CPU thread{'s' if chosen.threads > 1 else ''} for "
                       f"{res.free_cores:.1f} free cores")
        gpu_cuts = [c for c in candidates if self.uses_gpu(c.cut)]
        if res.gpu is None:
            reason += "; no GPU on this machine"
        elif gpu_cuts and all(c.why_not for c in gpu_cuts):
            reason += f"; no GPU placement can run: {min(gpu_cuts, key=lambda c: c.cut).why_not}"
        others = [c for c in candidates if c.cut != chosen.cut]
        runner_up = self.best(others)
        if runner_up is not None:
            reason += (f"; next best {self.describe_cut(runner_up.cut)}: "
                       f"{runner_up.prediction.samples_per_s:,.0f} samples/s")
        if demand is not None:
            reason += f"; the trainer takes up to {demand:,.0f} samples/s"
        if chosen.why_not:
            reason += f"; cannot run now: {chosen.why_not}"
        return PlacementDecision(chosen.cut, chosen.threads, chosen.prefetch, placement, self.batch_size,
                                 chosen.prediction, tuple(stages), reason, feasible=chosen.why_not is None)

    def _stage_reason(self, i: int, stage: Stage, cost: StageCost, chosen: Candidate,
                      candidates: Sequence[Candidate], m: Measurements, demand: float | None) -> tuple[Backend, str]:
        busy = m.resources.trainer_gpu_busy_fraction

        def per_batch(seconds: float | None) -> str:
            return "n/a" if seconds is None else f"{format_ms(seconds * (1000.0 * self.batch_size))} ms/batch"

        cpu, gpu = per_batch(cost.cpu_s_per_sample), per_batch(cost.gpu_s_per_sample)
        if i >= chosen.cut:
            cheaper_on_cpu = (cost.cpu_s_per_sample or 0) < (cost.gpu_s_per_sample or 0)
            note = "; data already on the GPU" if cheaper_on_cpu else ""
            return Backend.GPU, f"GPU: {gpu} vs CPU {cpu}; GPU {busy:.0%} busy{note}"
        moved = [c for c in candidates if c.cut <= i]
        if not moved or not stage.runs_on(Backend.GPU):
            return Backend.CPU, "CPU: runs only on the CPU"
        if m.resources.gpu is None:
            return Backend.CPU, "CPU: no GPU on this machine"
        if cost.gpu_s_per_sample is None:
            return Backend.CPU, "CPU: no GPU cost was measured"
        if busy >= GPU_SATURATED:
            return Backend.CPU, f"CPU: GPU {busy:.0%} busy with training"
        alt = self.best(moved)
        if alt is None:
            blocked = max((c for c in moved if c.why_not), key=lambda c: c.cut)
            return Backend.CPU, f"CPU: {cpu} vs GPU {gpu}; on the GPU {blocked.why_not}"
        if alt.score >= chosen.score * (1 - TIE):
            return Backend.CPU, (f"CPU: {cpu} vs GPU {gpu}; either keeps up with the trainer "
                                 f"({demand or 0:,.0f} samples/s), so the GPU is left to it")
        return Backend.CPU, (f"CPU: {cpu} vs GPU {gpu}; with it on the GPU the best plan predicts "
                             f"{alt.prediction.samples_per_s:,.0f} samples/s, "
                             f"this one {chosen.prediction.samples_per_s:,.0f}")
