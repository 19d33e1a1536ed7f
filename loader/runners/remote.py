"""Remote CPU workers on Ray: batches made by Ray actors on other machines' cores, beside the local threads.

Each worker is a Ray actor holding its own runner of the pipeline's CPU placement (it opens the source
itself, so the files must be where the workers can read them). Plans are dealt out in a fixed pattern: the
local runner takes ``num_threads`` of every ``num_threads + num_workers * cpus_per_worker`` plans, each worker
``cpus_per_worker``; results are taken back in plan order, a few per worker in flight (Ray's object store
carries them; backpressure is that window). Every plan makes its own batch (``isolated_plans``), so where a
plan was made does not change the batch: batches equal the local loader's, bit for bit, for the same seed
(with ``on_error="skip"``, a skipped sample's slot is padding in its own batch rather than filled from the
next plan's samples). Actors are created with ``max_restarts=-1`` and ``max_task_retries=-1``: if one dies,
Ray restarts it and runs its plans again, and since a plan's batch is a pure function of the plan, nothing is
lost or repeated.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import time
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from ...pipelines.spec import PipelineSpec
from ..errors import Skipped
from ..sampler import BatchPlan
from .contract import BatchInfo, Runner, RunnerConfig, StageTimes

IN_FLIGHT_PER_WORKER = 2
READY_TIMEOUT_S = 300.0  # for the workers to start and open the source


@dataclass(frozen=True)
class RayWorkers:
    """``num_workers`` Ray actors of ``cpus_per_worker`` CPUs each. ``address``: the Ray cluster to join; None
    joins the one ``RAY_ADDRESS`` names, or starts a local one. ``cores``: pin each worker to these CPU cores
    of its machine (benchmarks on one machine use it to keep workers off the trainer's cores)."""

    num_workers: int = 1
    cpus_per_worker: int = 1
    address: str | None = None
    cores: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("num_workers", "cpus_per_worker"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RayWorkers.{name} must be a positive integer, got {value!r}")
        if self.address is not None and (not isinstance(self.address, str) or not self.address):
            raise ValueError(f"RayWorkers.address must be a Ray address such as '10.0.0.1:6379' or None, "
                             f"got {self.address!r}")
        if self.cores is not None:
            object.__setattr__(self, "cores", tuple(int(c) for c in self.cores))


def connect(workers: RayWorkers) -> Any:
    """Ray, joined to the cluster ``workers`` names (or a local one); an error names the address."""
    try:
        import ray
    except ImportError:
        raise ImportError("remote workers need Ray: pip install 'feedline[ray]'") from None
    if ray.is_initialized():
        return ray
    address = workers.address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        _check_reachable(address)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    except Exception as e:  # Ray raises ConnectionError, RuntimeError or its own errors, depending on the cause
        where = repr(address) if address else "a new local cluster"
        raise ConnectionError(f"cannot reach the Ray cluster at {where}: {type(e).__name__}: {e}") from None
    return ray


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail at once, naming the address, where nothing listens (Ray itself would retry for minutes)."""
    import socket

    if address in ("auto", "local"):
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"Ray address must be 'host:port' (or 'ray://host:port', 'auto'), got {address!r}")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        raise ConnectionError(f"cannot reach the Ray cluster at {address!r}: {e.strerror or e}") from None


def available_workers(ray, workers: RayWorkers) -> int:
    """How many workers of ``workers.cpus_per_worker`` CPUs the cluster has room for on machines other than
    this one (workers on this machine would take the local threads' cores)."""
    here = ray.get_runtime_context().get_node_id()
    elsewhere = sum(node["Resources"].get("CPU", 0) for node in ray.nodes()
                    if node["Alive"] and node["NodeID"] != here)
    free = ray.available_resources().get("CPU", 0)
    return int(min(elsewhere, free) // workers.cpus_per_worker)


def object_store_seconds(ray, batch: dict, device: torch.device, repeats: int = 5) -> tuple[float, float]:
    """What a remote batch like ``batch`` costs on each side, the medians of ``repeats``: putting it into Ray's
    object store (a worker's task return is serialised the same way), and taking it out as tensors on
    ``device`` (the trainer's side). Both happen in this process, so a cross-machine transfer, which Ray
    overlaps with the worker's next batch, is in neither."""
    arrays = as_arrays(batch)
    put, take = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        ref = ray.put(arrays)
        stored = time.perf_counter()
        _to_torch(ray.get(ref), device)
        put.append(stored - started)
        take.append(time.perf_counter() - stored)
        del ref
    return statistics.median(put), statistics.median(take)


class _Maker:
    """The Ray actor: one runner of the CPU placement, making one plan's batch at a time."""

    def __init__(self, spec: PipelineSpec, config: RunnerConfig, cores: tuple[int, ...] | None, cache_rows: int):
        from ..sources import open_source
        from . import make_runner

        if cores is not None:
            os.sched_setaffinity(0, cores)
        self.source = open_source(spec.source, cache_rows=cache_rows)
        self.runner = make_runner(spec, self.source, config)
        self.reported = 0

    def make(self, plan: BatchPlan) -> tuple[dict, tuple, list]:
        started = time.perf_counter()
        (batch, info), = self.runner.batches(iter([plan]))  # run to the stream's end: its pipeline is reset
        skipped = [dataclasses.astuple(s) for s in self.runner.skipped[self.reported:]]
        self.reported = len(self.runner.skipped)
        return as_arrays(batch), (info.epoch, info.end, info.last, info.skipped, time.perf_counter() - started), \
            skipped

    def pid(self) -> int:
        return os.getpid()


class RemoteRunner:
    """The Runner contract over a local runner and Ray actors (the CPU placement only)."""

    def __init__(self, spec: PipelineSpec, source, config: RunnerConfig, workers: RayWorkers, make_local):
        self.ray = connect(workers)
        config = dataclasses.replace(config, isolated_plans=True)
        self.local: Runner = make_local(config)
        worker_config = dataclasses.replace(config, num_threads=workers.cpus_per_worker, prefetch=1)
        actor = self.ray.remote(_Maker).options(num_cpus=workers.cpus_per_worker, max_restarts=-1,
                                                max_task_retries=-1)
        # A table's cache holds what the Loader's does: a plan's rows come from a whole shuffle buffer.
        cache_rows = getattr(source, "requested_cache_rows", 0)
        self.actors = [actor.remote(spec, worker_config, workers.cores, cache_rows) for _ in range(workers.num_workers)]
        self._wait_ready(workers)
        # Who makes plan i: local slots for the local threads, then each worker's CPUs.
        self.pattern = [None] * config.num_threads + [a for a in self.actors for _ in range(workers.cpus_per_worker)]
        self.device = config.device
        self.window = IN_FLIGHT_PER_WORKER * len(self.pattern)  # plans dealt ahead of the one delivered next
        self.skipped: list[Skipped] = []
        # A table's bad rows are listed by every process that reads their chunk: each (where, index) goes in once.
        self._listed: set[tuple[str, int]] = set()
        self._local_noted = 0  # of the local runner's skips, those already noted
        self.remote_batches = 0
        self.wait_seconds = 0.0       # waiting for a worker's batch to be made and to arrive
        self.transfer_seconds = 0.0   # taking an arrived batch out of the object store, as tensors
        self.remote_seconds = 0.0     # the workers' own time making their batches

    def _wait_ready(self, workers: RayWorkers) -> None:
        """Block until every worker has started and opened the source, so that the time goes to the start
        rather than to the first batches; a cluster without room for them is an error, not a hang."""
        pending = [actor.pid.remote() for actor in self.actors]
        ready, waiting = self.ray.wait(pending, num_returns=len(pending), timeout=READY_TIMEOUT_S)
        self.ray.get(ready)  # a worker that failed to open the source raises its error here
        if waiting:
            self.close()
            raise TimeoutError(f"{len(waiting)} of {workers.num_workers} Ray workers of {workers.cpus_per_worker} "
                               f"CPU(s) did not start within {READY_TIMEOUT_S:.0f} s: the cluster has "
                               f"{self.ray.available_resources().get('CPU', 0):g} free CPUs")

    def batches(self, plans: Iterator[BatchPlan]) -> Iterator[tuple[dict, BatchInfo]]:
        deal = _Deal(plans, self.pattern)
        local = self.local.batches(deal.local_plans())
        try:
            while True:
                while len(deal.order) < self.window and deal.pull():
                    pass
                if not deal.order:
                    return
                future = deal.order.popleft()
                if future is None:
                    batch, info = next(local)
                    self._note(self.local.skipped[self._local_noted:])
                    self._local_noted = len(self.local.skipped)
                    yield batch, info
                    continue
                started = time.perf_counter()
                self.ray.wait([future], fetch_local=True)
                ready = time.perf_counter()
                arrays, info, skipped = self.ray.get(future)
                batch = _to_torch(arrays, self.device)
                self.wait_seconds += ready - started
                self.transfer_seconds += time.perf_counter() - ready
                self.remote_seconds += info[4]
                self.remote_batches += 1
                self._note([Skipped(*s) for s in skipped])
                yield batch, BatchInfo(*info[:4])
        finally:
            local.close()
            for future in deal.order:
                if future is not None:
                    self.ray.cancel(future)

    def _note(self, skips) -> None:
        for skip in skips:
            if (skip.where, skip.index) not in self._listed:
                self._listed.add((skip.where, skip.index))
                self.skipped.append(skip)

    def profile(self, plans: list[BatchPlan]) -> StageTimes:
        return self.local.profile(plans)

    def close(self) -> None:
        self.local.close()
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.actors = []


class _Deal:
    """Deals the plans out in the pattern, lazily: ``order`` holds, for each plan dealt, None (made locally)
    or the Ray future of its batch; ``local_plans()`` feeds the local runner its share, dealing further when it
    asks ahead of what was dealt."""

    def __init__(self, plans: Iterator[BatchPlan], pattern: list):
        self.plans = iter(plans)
        self.pattern = pattern
        self.dealt = 0
        self.order: deque = deque()
        self.local: deque[BatchPlan] = deque()

    def pull(self) -> bool:
        plan = next(self.plans, None)
        if plan is None:
            return False
        actor = self.pattern[self.dealt % len(self.pattern)]
        self.dealt += 1
        if actor is None:
            self.local.append(plan)
            self.order.append(None)
        else:
            self.order.append(actor.make.remote(plan))
        return True

    def local_plans(self) -> Iterator[BatchPlan]:
        while True:
            while not self.local:
                if not self.pull():
                    return
            yield self.local.popleft()


def as_arrays(value):
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, dict):
        return {k: as_arrays(v) for k, v in value.items()}
    return value


def _to_torch(value, device: torch.device):
    """A worker's batch as tensors on ``device``, without copying on the host: the tensors are views of the
    arrays in Ray's object store, which stay there while the tensors live. NumPy marks them read-only because
    other readers could share an object; a batch has one reader, the trainer, which may write to it."""
    if isinstance(value, np.ndarray):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            tensor = torch.from_numpy(value)
        return tensor if device.type == "cpu" else tensor.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {k: _to_torch(v, device) for k, v in value.items()}
    return value
