"""Remote CPU workers on Ray: batches made by Ray actors on other machines' cores, beside the local threads.

Each worker is a Ray actor (``remote_workers.Maker``) holding its own runner of the pipeline's CPU placement (it
opens the source itself, so the files must be where the workers can read them). Plans are dealt out in a fixed
pattern: the local runner takes ``num_threads`` of every ``num_threads + num_workers * cpus_per_worker`` plans,
each worker ``cpus_per_worker``; results are taken back in plan order, a few per worker in flight (Ray's object
store carries them; backpressure is that window). Every plan makes its own batch (``isolated_plans``), so where
a plan was made does not change the batch: batches equal the local loader's, bit for bit, for the same seed
(with ``on_error="skip"``, a skipped sample's slot is padding in its own batch rather than filled from the next
plan's samples).

Failures are bounded. Ray restarts a worker whose process dies (``max_restarts=-1``) and sends the plans it
lost again, each at most ``MAX_PLAN_RETRIES`` times (``max_task_retries``): a batch is a pure function of its
plan, so nothing is lost or repeated; a plan that kills its worker every time ends in a ``RemoteWorkerError``
naming its samples and the failure. Every wait on Ray is bounded: a batch late by
``RayWorkers.stall_warning_s`` is logged (logger ``feedline``, WARNING, naming the worker and the plan) and
again at that interval; one late by ``batch_timeout_s`` restarts its worker and raises TimeoutError; workers
that cannot start within ``start_timeout_s`` raise TimeoutError. The Loaders of a process share their actors
(``remote_workers``).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import statistics
import time
import uuid
import warnings
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from ...pipelines.spec import PipelineSpec
from ..errors import Skipped
from ..sampler import BatchPlan
from . import remote_workers
from .contract import BatchInfo, Runner, RunnerConfig, StageTimes
from .remote_workers import Shape, Worker, as_arrays

log = logging.getLogger("feedline")

IN_FLIGHT_PER_WORKER = 2
MAX_PLAN_RETRIES = remote_workers.MAX_PLAN_RETRIES
START_TIMEOUT_S = 300.0   # for the workers to start and open the source
BATCH_TIMEOUT_S = 600.0   # for one remote batch, from when the trainer's side waits for it
STALL_WARNING_S = 60.0    # a batch this late is logged, and again at this interval
_GET_TIMEOUT_S = 60.0     # for an object already in this node's store


class RemoteWorkerError(RuntimeError):
    """A plan whose worker died making it, again each of the ``MAX_PLAN_RETRIES`` times Ray sent it again."""


@dataclass(frozen=True)
class RayWorkers:
    """``num_workers`` Ray actors of ``cpus_per_worker`` CPUs each. ``address``: the Ray cluster to join; None
    joins the one ``RAY_ADDRESS`` names, or starts a local one. ``cores``: pin each worker to these CPU cores
    of its machine (benchmarks on one machine use it to keep workers off the trainer's cores).

    Bounds, in seconds: ``start_timeout_s`` for the workers to start, ``batch_timeout_s`` for one batch (the
    Loader then raises TimeoutError, and the worker is restarted), ``stall_warning_s`` before a late batch is
    logged (then at that interval). Loaders given equal ``RayWorkers`` (same address, CPUs per worker and
    cores) share one set of actors."""

    num_workers: int = 1
    cpus_per_worker: int = 1
    address: str | None = None
    cores: tuple[int, ...] | None = None
    start_timeout_s: float = START_TIMEOUT_S
    batch_timeout_s: float = BATCH_TIMEOUT_S
    stall_warning_s: float = STALL_WARNING_S

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
        for name in ("start_timeout_s", "batch_timeout_s", "stall_warning_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                raise ValueError(f"RayWorkers.{name} must be a positive, finite number of seconds, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.stall_warning_s > self.batch_timeout_s:
            raise ValueError(f"RayWorkers.stall_warning_s ({self.stall_warning_s:g}) must not exceed "
                             f"batch_timeout_s ({self.batch_timeout_s:g}): a late batch is logged before the "
                             f"Loader gives up on it")

    @property
    def shape(self) -> Shape:
        return Shape(self.address, self.cpus_per_worker, self.cores)


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
    this one (workers on this machine would take the local threads' cores), counting those of the same shape
    that this process already runs there for other Loaders (they are shared)."""
    here = ray.get_runtime_context().get_node_id()
    elsewhere = sum(node["Resources"].get("CPU", 0) for node in ray.nodes()
                    if node["Alive"] and node["NodeID"] != here)
    free = ray.available_resources().get("CPU", 0)
    shared = remote_workers.running_elsewhere(ray, workers.shape, here)
    return int(min(elsewhere // workers.cpus_per_worker, free // workers.cpus_per_worker + shared))


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
        _to_torch(ray.get(ref, timeout=_GET_TIMEOUT_S), device)
        put.append(stored - started)
        take.append(time.perf_counter() - stored)
        del ref
    return statistics.median(put), statistics.median(take)


@dataclass(frozen=True)
class _Job:
    """A plan sent to a worker (``worker``: its place in the runner's team)."""

    plan: BatchPlan
    worker: int
    future: Any


class RemoteRunner:
    """The Runner contract over a local runner and Ray actors (the CPU placement only)."""

    def __init__(self, spec: PipelineSpec, source, config: RunnerConfig, workers: RayWorkers, make_local):
        self.ray = connect(workers)
        self.workers = workers
        self.source = source
        config = dataclasses.replace(config, isolated_plans=True)
        worker_config = dataclasses.replace(config, num_threads=workers.cpus_per_worker, prefetch=1)
        # A table's cache holds what the Loader's does: a plan's rows come from a whole shuffle buffer.
        cache_rows = getattr(source, "requested_cache_rows", 0)
        self.key = uuid.uuid4().hex  # this runner's pipeline on the (shared) workers
        self._box = [self.ray.put((spec, worker_config, cache_rows))]
        self.team: list[Worker] = remote_workers.acquire(self.ray, workers.shape, workers.num_workers,
                                                         workers.start_timeout_s, self.key)
        self.actors = [w.actor for w in self.team]
        self._release = weakref.finalize(self, _release, self.ray, workers.shape, self.key)
        try:
            self._load(workers)
            self.local: Runner = make_local(config)
        except BaseException:
            self._release()
            raise
        # Who makes plan i: local slots for the local threads, then each worker's CPUs.
        self.pattern = [None] * config.num_threads + [i for i in range(len(self.team))
                                                      for _ in range(workers.cpus_per_worker)]
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

    def _load(self, workers: RayWorkers) -> None:
        """Open the pipeline on every worker, so that the time goes to the start rather than to the first
        batches, and a worker that cannot open the source says so now."""
        pending = [w.actor.load.remote(self.key, self._box) for w in self.team]
        ready, waiting = self.ray.wait(pending, num_returns=len(pending), timeout=workers.start_timeout_s)
        for worker, pid in zip(self.team, self.ray.get(ready, timeout=_GET_TIMEOUT_S)):
            worker.pid = pid
        if waiting:
            raise TimeoutError(f"{len(waiting)} of {len(pending)} Ray workers did not open the pipeline's "
                               f"source within {workers.start_timeout_s:g} s (RayWorkers.start_timeout_s)")

    def batches(self, plans: Iterator[BatchPlan]) -> Iterator[tuple[dict, BatchInfo]]:
        deal = _Deal(plans, self.pattern, self._send)
        local = self.local.batches(deal.local_plans())
        try:
            while True:
                while len(deal.order) < self.window and deal.pull():
                    pass
                if not deal.order:
                    return
                job = deal.order.popleft()
                if job is None:
                    batch, info = next(local)
                    self._note(self.local.skipped[self._local_noted:])
                    self._local_noted = len(self.local.skipped)
                    yield batch, info
                    continue
                batch, info, skipped = self._take(job)
                self._note([Skipped(*s) for s in skipped])
                yield batch, BatchInfo(*info[:4])
        finally:
            local.close()
            for job in deal.order:
                if job is not None:
                    self._cancel(job.future)

    def _send(self, worker: int, plan: BatchPlan) -> Any:
        return self.team[worker].actor.make.remote(self.key, self._box, plan)

    def _take(self, job: _Job) -> tuple[dict, tuple, list]:
        """The job's batch as tensors, waited for at most ``batch_timeout_s`` (Ray's retries included)."""
        started = time.perf_counter()
        self._wait(job)
        ready = time.perf_counter()
        try:
            arrays, info, skipped, pid = self.ray.get(job.future, timeout=_GET_TIMEOUT_S)
        except _worker_failures(self.ray) as e:
            raise self._failure(job, e) from None
        batch = _to_torch(arrays, self.device)
        self.team[job.worker].pid = pid
        self.wait_seconds += ready - started
        self.transfer_seconds += time.perf_counter() - ready
        self.remote_seconds += info[4]
        self.remote_batches += 1
        return batch, info, skipped

    def _wait(self, job: _Job) -> None:
        """Until the job's result (or its failure) is here: logged each ``stall_warning_s`` it is late, a
        TimeoutError after ``batch_timeout_s``."""
        limit, every = self.workers.batch_timeout_s, self.workers.stall_warning_s
        began = time.monotonic()
        warn_at = every
        while True:
            waited = time.monotonic() - began
            if waited >= limit:
                self._stalled(job, waited)
            ready, _ = self.ray.wait([job.future], timeout=max(min(warn_at, limit) - waited, 0.0), fetch_local=True)
            if ready:
                return
            waited = time.monotonic() - began
            if warn_at <= waited < limit:
                log.warning("feedline: %s has not returned %s for %.1f s; the Loader gives up at %g s "
                            "(RayWorkers.batch_timeout_s)", self._worker(job.worker),
                            describe_plan(job.plan, self.source), waited, limit)
                warn_at += every

    def _stalled(self, job: _Job, waited: float) -> None:
        """A batch past the hard limit: restart its worker (so that it holds no other Loader either; the plan,
        cancelled first, is not sent again) and raise."""
        worker = self._worker(job.worker)
        self._cancel(job.future)
        try:
            self.ray.kill(self.team[job.worker].actor, no_restart=False)
        except Exception:
            pass
        raise TimeoutError(f"{worker} did not return {describe_plan(job.plan, self.source)} within "
                           f"{waited:.0f} s (RayWorkers.batch_timeout_s={self.workers.batch_timeout_s:g}); the "
                           f"worker was restarted")

    def _failure(self, job: _Job, error: Exception) -> RemoteWorkerError:
        """The job's worker died making it, and again each time Ray sent it again (or its result was lost)."""
        text = " ".join(str(error).split())
        if isinstance(error, self.ray.exceptions.ObjectLostError):
            return RemoteWorkerError(f"the batch that {self._worker(job.worker)} made from "
                                     f"{describe_plan(job.plan, self.source)} was lost before it was taken (its "
                                     f"machine or the trainer's store failed). Ray's error: {type(error).__name__}: "
                                     f"{text[:600]}")
        return RemoteWorkerError(
            f"{self._worker(job.worker)} failed making {describe_plan(job.plan, self.source)}: Ray restarts a "
            f"worker whose process ends and sends it the plan again, at most MAX_PLAN_RETRIES={MAX_PLAN_RETRIES} "
            f"times, and it failed each time (a plan that crashes its worker, e.g. a segmentation fault in "
            f"native code, or the out-of-memory killer; the Ray logs on {self.team[job.worker].node_ip} name the "
            f"cause). Ray's error: {type(error).__name__}: {text[:600]}")

    def _worker(self, index: int) -> str:
        return self.team[index].describe(index + 1, len(self.team))

    def _cancel(self, future) -> None:
        try:
            self.ray.cancel(future)
        except Exception:  # already finished, or Ray is gone
            pass

    def _note(self, skips) -> None:
        for skip in skips:
            if (skip.where, skip.index) not in self._listed:
                self._listed.add((skip.where, skip.index))
                self.skipped.append(skip)

    def profile(self, plans: list[BatchPlan]) -> StageTimes:
        return self.local.profile(plans)

    def close(self) -> None:
        self.local.close()
        self._release()
        self.actors = []


def _release(ray, shape: Shape, key: str) -> None:
    """A runner's end (closed, or collected): its pipeline leaves the workers, and their pool loses a user."""
    try:
        if ray.is_initialized():
            remote_workers.release(ray, shape, key)
    except Exception:  # at interpreter exit, Ray may already be half gone
        pass


def _worker_failures(ray) -> tuple[type[Exception], ...]:
    """Ray's errors for a task whose worker died (after Ray's retries), or whose result was lost with its
    machine. A plan's own error (a bad sample with on_error="raise") is not among them: it reaches the trainer."""
    errors = ray.exceptions
    return errors.RayActorError, errors.ObjectLostError, errors.NodeDiedError


def describe_plan(plan: BatchPlan, source, shown: int = 3) -> str:
    """``batch 4 of epoch 1 (samples 17, 3, 9 and 61 more: a.jpg, b.jpg, c.jpg, ...)``: where a plan's samples are."""
    indices = [int(i) for i in plan.indices[plan.valid]]
    first = indices[:shown]
    more = f" and {len(indices) - shown} more" if len(indices) > shown else ""
    text = f"batch {plan.batch} of epoch {plan.epoch} (samples {', '.join(map(str, first))}{more}"
    where = getattr(source, "where", None)
    if callable(where) and first:
        try:
            text += ": " + ", ".join(where(i) for i in first) + (", ..." if more else "")
        except Exception:  # naming is best effort: the error being reported matters more
            pass
    return text + ")"


class _Deal:
    """Deals the plans out in the pattern, lazily: ``order`` holds, for each plan dealt, None (made locally)
    or the job sent to a worker; ``local_plans()`` feeds the local runner its share, dealing further when it
    asks ahead of what was dealt."""

    def __init__(self, plans: Iterator[BatchPlan], pattern: list, send):
        self.plans = iter(plans)
        self.pattern = pattern
        self.send = send
        self.dealt = 0
        self.order: deque = deque()
        self.local: deque[BatchPlan] = deque()

    def pull(self) -> bool:
        plan = next(self.plans, None)
        if plan is None:
            return False
        worker = self.pattern[self.dealt % len(self.pattern)]
        self.dealt += 1
        if worker is None:
            self.local.append(plan)
            self.order.append(None)
        else:
            self.order.append(_Job(plan, worker, self.send(worker, plan)))
        return True

    def local_plans(self) -> Iterator[BatchPlan]:
        while True:
            while not self.local:
                if not self.pull():
                    return
            yield self.local.popleft()


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
