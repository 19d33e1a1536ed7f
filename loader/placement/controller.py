"""Every placement decision of one Loader, made in one place: the cut, the device batches arrive on, the CPU
threads and prefetch depth, the remote workers used, and the move to the CPU when the GPU fails."""
from __future__ import annotations

import dataclasses
import logging
import warnings
import weakref
from collections.abc import Mapping
from typing import Any, Callable

import torch

from ...pipelines.spec import PipelineSpec
from ..devices import gpu_available, is_gpu_failure
from ..errors import PlacementError
from ..runners.contract import RunnerConfig
from ..runners.remote import RayWorkers
from .auto import AutoPlacement
from .decision import PlacementDecision
from .monitors import WaitMonitor
from .profiler import OrderFactory, RunnerFactory
from .remote_decision import RemoteDecision, measure_and_decide, remote_report
from .resolve import resolve, uses_gpu

log = logging.getLogger("feedline")
CUDA = torch.device("cuda")


class PlacementController:
    """Decides where one Loader's stages run, and when that changes; the Loader follows. The rules:

    * ``placement`` resolves to a cut (``resolve``); under ``"auto"`` the scheduler (``AutoPlacement``) then
      profiles at the first iteration, chooses the cut, threads and prefetch, and re-plans as the trainer runs;
    * batches wanted on the CPU (``device`` given as the CPU) keep every stage there under ``"auto"``; a fixed
      placement with GPU stages is refused;
    * remote workers run the CPU placement: the same two answers; under ``"auto"`` as many are used as pay
      (``remote_decision``, measured at the first iteration), with a fixed placement all of them;
    * a cut with GPU stages delivers on CUDA when no device was given, and moves there when a re-plan puts
      stages on the GPU;
    * a GPU that fails under a GPU cut sends the rest of the run to the CPU placement (``fall_back``).

    ``device``: the one asked for (None: unset). ``gpu``: whether this machine has a usable GPU (default: ask
    CUDA). ``attach`` hands the controller the Loader's runner configuration and how the Loader follows a
    change: ``follow(config)`` rebuilds its runner for ``config`` from the next batch on.
    """

    def __init__(self, pipeline: PipelineSpec, placement: str | Mapping, *, device: torch.device | None,
                 remote: RayWorkers | None, gpu: bool | None = None):
        self.pipeline = pipeline
        self.automatic = isinstance(placement, str) and placement == "auto"
        self.gpu = gpu_available() if gpu is None else gpu
        cut = resolve(pipeline, placement, self.gpu)
        if uses_gpu(pipeline, cut) and device is not None and device.type == "cpu":
            if not self.automatic:
                raise PlacementError(f"placement {pipeline.describe_cut(cut)!r} runs stages on the GPU, so "
                                     f"batches arrive on the GPU; use device='cuda' (or leave device unset), or "
                                     f"placement='cpu'")
            cut = pipeline.all_cpu  # the trainer wants CPU tensors: keep the whole pipeline there
        if remote is not None and not isinstance(remote, RayWorkers):
            raise TypeError(f"remote must be a feedline.loader.RayWorkers, got {type(remote).__name__}")
        if remote is not None and uses_gpu(pipeline, cut):
            if not self.automatic:
                raise PlacementError(f"remote workers run the CPU placement of a pipeline; placement "
                                     f"{pipeline.describe_cut(cut)!r} puts stages on the GPU")
            cut = pipeline.all_cpu
        self.remote = remote
        # The workers used: all of them with a fixed placement; with "auto", as many as pay, decided at the start.
        self.remote_workers = None if self.automatic else remote
        self.remote_decision: RemoteDecision | None = None
        self.fallbacks: list[str] = []
        self.auto: AutoPlacement | None = None
        # the one clock of the trainer's waits: the scheduler reads it, and the Loader's live figures (its meter)
        self.waits = WaitMonitor()
        self.config: RunnerConfig | None = None  # set by attach
        self._initial = (cut, self._device_for(cut, device or torch.device("cpu")))
        self._follow: Callable[[RunnerConfig], None] = lambda config: None
        self._group_rows: int | None = None

    def _device_for(self, cut: int, device: torch.device) -> torch.device:
        return CUDA if uses_gpu(self.pipeline, cut) and device.type != "cuda" else device

    def attach(self, config: RunnerConfig, *, runners: RunnerFactory, orders: OrderFactory, group_rows: int | None,
               follow: Callable[[RunnerConfig], None]) -> None:
        """``config``: the Loader's runner configuration, made with this controller's ``cut`` and ``device``;
        ``runners`` and ``orders`` make probe runners and orders over the Loader's source (``AutoPlacement``);
        ``group_rows``: rows a remote worker makes at a time (a table's shuffle buffer-full; None for images).
        Bound methods are held weakly: the Loader holds its controller, and a cycle back would keep a dropped
        Loader's batch thread, worker threads and table cache alive until the next garbage collection."""
        runners, orders, follow = _weakly(runners), _weakly(orders), _weakly(follow)
        self.config, self._follow, self._group_rows = config, follow, group_rows
        if self.automatic:
            self.auto = AutoPlacement(self.pipeline, config, runners, orders, config.num_threads,
                                      cuts=self._auto_cuts(), gpu=self.gpu, wait=self.waits)
        log.info("feedline: %s placement %s (%s)", self.pipeline.name, self.pipeline.describe_cut(self.cut),
                 ", ".join(f"{k}={v}" for k, v in self.stages.items()))

    def _auto_cuts(self) -> list[int]:
        """The cuts the scheduler may choose. Without a GPU every GPU cut is ruled out by the readings (and says
        so); with one, batches wanted on the CPU, or made with remote workers, keep every stage on the CPU."""
        if self.remote is not None or (self.gpu and self.device.type != "cuda"):
            return [self.pipeline.all_cpu]
        return self.pipeline.valid_cuts()

    # ---- the decision now --------------------------------------------------------------------------
    @property
    def cut(self) -> int:
        return self._initial[0] if self.config is None else self.config.cut

    @property
    def device(self) -> torch.device:
        return self._initial[1] if self.config is None else self.config.device

    @property
    def threads(self) -> int:
        return self.config.num_threads

    @property
    def prefetch(self) -> int:
        return self.config.prefetch

    @property
    def on_gpu(self) -> bool:
        """Whether the current cut runs any stage on the GPU."""
        return uses_gpu(self.pipeline, self.cut)

    @property
    def stages(self) -> dict[str, str]:
        """The backend of every stage, as placed now."""
        return {k: v.value for k, v in self.pipeline.backends_at(self.cut).items()}

    # ---- what changes it ---------------------------------------------------------------------------
    def begin(self) -> None:
        """At the start of an iteration: under ``"auto"``, the first time, profile and place (and decide how
        many remote workers pay)."""
        if self.auto is None or self.auto.decision is not None:
            return
        decision = self.auto.start()
        if self.remote is not None:
            self._decide_remote(decision)
        self._adopt(decision)

    def _decide_remote(self, decision: PlacementDecision) -> None:
        auto = self.auto
        self.remote_decision = measure_and_decide(decision, self.remote, lambda: auto.sample_batch(decision.cut),
                                                  self.device, self._group_rows)
        log.info("feedline: remote workers %s", self.remote_decision.why)
        if self.remote_decision.workers:
            self.remote_workers = dataclasses.replace(self.remote, num_workers=self.remote_decision.workers)
            self._move(self.cut, self.threads, self.prefetch)  # the runner made so far does not deal plans out

    def delivered(self, samples: int) -> None:
        """A batch of ``samples`` went to the trainer: under ``"auto"``, re-plan when it is time."""
        if self.auto is not None:
            decision = self.auto.delivered(samples)
            if decision is not None:
                self._adopt(decision)  # the next batch comes from the new placement, after this one

    def _adopt(self, decision: PlacementDecision) -> None:
        if (decision.cut, decision.threads, decision.prefetch) != (self.cut, self.threads, self.prefetch):
            self._move(decision.cut, decision.threads, decision.prefetch)
        self.auto.moved()

    def fall_back(self, error: BaseException) -> bool:
        """Whether ``error`` is the GPU failing under a GPU cut; if so the placement is now the CPU's for the rest
        of the run (the Loader makes the batch in flight again there)."""
        if not (self.on_gpu and is_gpu_failure(error)):
            return False
        old = self.pipeline.describe_cut(self.cut)
        self._move(self.pipeline.all_cpu, self.threads, self.prefetch)
        self.auto = None  # the GPU is gone for this run; placement stays on the CPU
        first_line = str(error).splitlines()[0] if str(error) else ""
        self.fallbacks.append(f"{old} -> cpu: {type(error).__name__}: {first_line}")
        warnings.warn(f"feedline: the GPU failed during placement {old!r} ({type(error).__name__}: {error}); "
                      f"continuing on the CPU placement from the batch in flight", RuntimeWarning, stacklevel=4)
        return True

    def _move(self, cut: int, threads: int, prefetch: int) -> None:
        device = self._device_for(cut, self.device)
        self.config = dataclasses.replace(self.config, cut=cut, num_threads=threads, prefetch=prefetch, device=device)
        self._follow(self.config)
        log.info("feedline: %s placement %s, %d threads, prefetch %d", self.pipeline.name,
                 self.pipeline.describe_cut(cut), threads, prefetch)

    def report(self) -> dict[str, Any]:
        """``Loader.plan``: under ``"auto"``, the scheduler's decision, the measurements behind it and the history
        of changes; otherwise the fixed placement (and the GPU failures that moved it)."""
        report = self.auto.report() if self.auto is not None else {
            "placement": self.pipeline.describe_cut(self.cut), "cut": self.cut, "threads": self.threads,
            "prefetch": self.prefetch, "stages": self.stages, "fallbacks": list(self.fallbacks)}
        if self.remote is not None:
            report["remote"] = remote_report(self.remote, self.remote_workers, self.remote_decision)
        return report


def _weakly(fn: Callable) -> Callable:
    """``fn``, holding its object weakly if it is a bound method (calling it once the object is gone is an error
    that says so)."""
    if not hasattr(fn, "__self__") or not hasattr(fn, "__func__"):
        return fn
    method, name = weakref.WeakMethod(fn), fn.__func__.__qualname__

    def call(*args, **kwargs):
        bound = method()
        if bound is None:
            raise ReferenceError(f"the object whose {name} this was is gone")
        return bound(*args, **kwargs)
    return call
