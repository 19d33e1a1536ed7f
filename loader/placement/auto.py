"""``placement="auto"``: profile once, let the scheduler choose the cut, threads and prefetch depth, and
re-plan from live readings (CPU and GPU use, the trainer's waits and steps) while the trainer runs."""
from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from typing import Any, Callable, Sequence

import torch

from ...pipelines.spec import PipelineSpec
from ..devices import gpu_available
from ..runners.contract import RunnerConfig
from .decision import PlacementDecision, trainer_load
from .measurements import Measurements, Resources
from .monitors import NoGpu, NvmlGpuMonitor, PsutilCpuMonitor, WaitMonitor
from .profiler import PROBE_SEED, OrderFactory, Profile, RunnerFactory, profile
from .report import decision_dict, decision_table
from .rounds import measure_rounds
from .scheduler import Scheduler

log = logging.getLogger("feedline")
REPLAN_EVERY_S = 10.0
MEASURED_MARGIN = 0.03  # a measured difference smaller than this is not worth a change, whatever the noise
CHECK_MIN_ROUNDS = 3
CHECK_MAX_ROUNDS = 8
CHECK_TOLERANCE = 0.02  # the thread check's medians are stable once their relative standard error is below this
CHECK_SECONDS = 0.3


class AutoPlacement:
    """``config`` is the Loader's runner configuration (batch size, device, ...); ``runners`` makes a runner
    for a configuration over the Loader's opened source, ``orders`` that source's order for a batch size and
    seed. Probes and profiling run on runners and orders of their own, never on the Loader's. ``cuts``: those
    the scheduler may choose (default every valid cut; ``controller.PlacementController`` narrows them); ``gpu``:
    whether the machine has a usable GPU (default: ask CUDA); ``wait``: the clock of the trainer's waits it reads
    (default: one of its own)."""

    def __init__(self, spec: PipelineSpec, config: RunnerConfig, runners: RunnerFactory, orders: OrderFactory,
                 cores: int, *, replan_every_s: float = REPLAN_EVERY_S, clock: Callable[[], float] = time.monotonic,
                 cuts: Sequence[int] | None = None, gpu: bool | None = None, wait: WaitMonitor | None = None):
        device, batch_size = config.device, config.batch_size
        self.gpu_present = gpu_available() if gpu is None else gpu
        on_gpu = device.type == "cuda" and self.gpu_present
        self.spec = spec
        self.config = config
        self.runners = runners
        self.orders = orders
        self.batch_size = batch_size
        self.device = device
        self.scheduler = Scheduler(spec, cuts, batch_size=batch_size, output_device="gpu" if on_gpu else "cpu",
                                   max_threads=cores, clock=clock)
        self.cpu = PsutilCpuMonitor()
        self.gpu = NvmlGpuMonitor.create(device.index or 0) if on_gpu else NoGpu("batches are delivered on the CPU"
                                                                                 if self.gpu_present else "no GPU")
        self.wait = WaitMonitor() if wait is None else wait  # the trainer's waits (the controller's clock)
        self.replan_every_s = replan_every_s
        self.profile: Profile | None = None
        self.thread_check: dict[int, float] = {}
        self.thread_check_rounds: dict[str, Any] | None = None  # the rounds, their medians and spreads
        self.start_seconds = 0.0  # profiling plus the measured thread check
        self.last: Measurements | None = None
        self._clock = clock
        self._since = clock()
        self._samples = 0

    @property
    def decision(self) -> PlacementDecision | None:
        """The scheduler's current placement decision (None until ``start``)."""
        return self.scheduler.current

    def start(self) -> PlacementDecision:
        """Profile the pipeline, choose the first plan, and check its thread count by measuring."""
        started = time.perf_counter()
        self.profile = profile(self.spec, self.config, self.runners, self.orders,
                               gpu=self.gpu_present and self.device.type == "cuda")
        self.last = self._measurements(None)
        plan = self.scheduler.update(self.last)
        plan = self.check_threads(plan)
        self.start_seconds = time.perf_counter() - started
        log.info("feedline: %s auto placement (profiled in %.1f s):\n%s", self.spec.name, self.profile.seconds,
                 decision_table(plan, self.last))
        self._restart_window()
        return plan

    def check_threads(self, plan: PlacementDecision,
                      probe: Callable[[int, int], "_Probe"] | None = None) -> PlacementDecision:
        """The model counts cores, not what oversubscribing them costs: the batch thread and the trainer's
        compete with the worker threads. Measure the chosen thread count against one fewer, in alternating
        rounds until both medians are stable within CHECK_TOLERANCE (at most CHECK_MAX_ROUNDS), and take fewer
        threads only where they win by more than the noise (and MEASURED_MARGIN); fewer threads winning also caps
        later re-plans. ``probe(cut, threads)`` makes the timer of one placement (default ``self.probe``; a test
        passes scripted ones): called, it returns samples/s; ``close()`` ends it."""
        probe = self.probe if probe is None else probe
        if plan.threads <= 1:
            return plan
        check_s = CHECK_MIN_ROUNDS * 2 * CHECK_SECONDS
        epoch_s = self.orders(self.batch_size, PROBE_SEED).per_rank / max(plan.samples_per_s, 1e-9)
        if epoch_s < check_s:  # (a tiny dataset: what fewer threads could save is less than the check costs)
            self.thread_check_rounds = {"skipped": f"an epoch is predicted to take {epoch_s:.2f} s, less than the "
                                                   f"check's {check_s:.1f} s"}
            return plan
        fewer = plan.threads - 1
        probes = {t: probe(plan.cut, t) for t in (plan.threads, fewer)}
        try:
            rounds = measure_rounds(list(probes), lambda t: probes[t](), min_rounds=CHECK_MIN_ROUNDS,
                                    max_rounds=CHECK_MAX_ROUNDS, tolerance=CHECK_TOLERANCE)
        finally:
            for probe in probes.values():
                probe.close()
        self.thread_check = rounds.medians
        self.thread_check_rounds = rounds.report()
        if rounds.best(plan.threads, MEASURED_MARGIN) != fewer:
            return plan
        best = rounds.medians
        self.scheduler.max_threads = fewer
        return self.scheduler.adopt(plan.cut, fewer, self.last, reason=(
            f"measured {best[fewer]:.0f} samples/s with {fewer} threads against {best[plan.threads]:.0f} with "
            f"{plan.threads} (medians of {rounds.rounds} rounds): the batch thread needs a core too"))

    def probe(self, cut: int, threads: int) -> "_Probe":
        """A timer of the placement at ``cut`` with ``threads`` worker threads, on a runner and order of its own
        (seed PROBE_SEED), outside the trainer's epochs."""
        config = dataclasses.replace(self.config, cut=cut, num_threads=threads, seed=PROBE_SEED)
        return _Probe(self.runners(config), self.orders(self.batch_size, PROBE_SEED), self.device,
                      untimed=config.prefetch + 1)

    def sample_batch(self, cut: int) -> dict:
        """One batch made at ``cut`` on one thread, outside the trainer's epochs (what a remote worker would
        send: the remote workers' decision times it through the object store)."""
        probe = self.probe(cut, 1)
        probe.close()
        return probe.first

    def _measurements(self, samples_per_s: float | None) -> Measurements:
        cpu = self.cpu.sample()
        gpu = self.gpu.sample()
        plan = self.scheduler.current
        if plan is not None and samples_per_s:
            cores_busy, gpu_busy = trainer_load(cpu.process_cores_busy, gpu, plan, samples_per_s)
        else:
            cores_busy, gpu_busy = 0.0, (gpu.utilization if gpu is not None else 0.0)
        resources = Resources(cores=cpu.cores, trainer_cpu_cores_busy=cores_busy, gpu=gpu,
                              trainer_gpu_busy_fraction=gpu_busy, h2d_bytes_per_s=self.profile.h2d_bytes_per_s)
        wait = self.wait.sample()
        return Measurements(self.profile.costs, self.profile.source_bytes_per_sample, resources,
                            wait if wait.batches else None, samples_per_s, self.profile.batch_costs)

    def _restart_window(self) -> None:
        self._since, self._samples = self._clock(), 0
        self.wait.reset()

    def delivered(self, samples: int) -> PlacementDecision | None:
        """Count a delivered batch; every ``replan_every_s`` ask the scheduler, and return a new plan to move to."""
        self._samples += samples
        elapsed = self._clock() - self._since
        if elapsed < self.replan_every_s:
            return None
        self.last = self._measurements(self._samples / elapsed if elapsed > 0 else None)
        before = self.scheduler.current
        plan = self.scheduler.update(self.last)
        self._since, self._samples = self._clock(), 0
        if plan is None or (before is not None and (plan.cut, plan.threads, plan.prefetch) ==
                            (before.cut, before.threads, before.prefetch)):
            return None
        log.info("feedline: %s re-planned: %s -> %s (%s)", self.spec.name, before.placement if before else "-",
                 plan.placement, self.scheduler.history[-1].reason)
        return plan

    def moved(self) -> None:
        """The Loader applied a plan: readings from the old one must not count for the new."""
        self._restart_window()

    def report(self) -> dict[str, Any]:
        plan = self.scheduler.current
        if plan is None:
            return {"placement": "auto", "status": "not profiled yet (profiling runs at the first iteration)"}
        out = decision_dict(plan, self.last)
        out["profile_seconds"] = self.profile.seconds
        out["profile_samples"] = self.profile.samples
        out["start_seconds"] = self.start_seconds
        out["thread_check_samples_per_s"] = {str(k): v for k, v in self.thread_check.items()}
        out["thread_check"] = self.thread_check_rounds
        out["history"] = [{"time": m.time, "from": m.old.placement if m.old else None, "to": m.new.placement,
                           "threads": m.new.threads, "prefetch": m.new.prefetch, "reason": m.reason}
                          for m in self.scheduler.history]
        return out


class _Probe:
    """Times one placement on batches outside the trainer's epochs: each call runs at least CHECK_SECONDS,
    after taking ``untimed`` batches untimed: those its runner read ahead while another probe was timed (free
    batches that would count as made in this one's time)."""

    def __init__(self, runner, sampler, device: torch.device, untimed: int = 0):
        self.runner = runner
        self.untimed = untimed
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        plans = (plan for epoch in itertools.count() for plan in sampler.epoch(epoch))
        self.batches = runner.batches(plans)
        self.stream = (batch for batch, _ in self.batches if batch is not None)
        self.first = next(self.stream)  # build and warm up

    def __call__(self) -> float:
        self.first = None  # its buffers may be reused while timing
        for _ in range(self.untimed):
            next(self.stream)
        self.sync()
        started = time.perf_counter()
        samples = 0
        while time.perf_counter() - started < CHECK_SECONDS or samples == 0:
            samples += len(next(self.stream)["index"])
        self.sync()
        return samples / (time.perf_counter() - started)

    def close(self) -> None:
        self.stream.close()
        self.batches.close()
        self.runner.close()
