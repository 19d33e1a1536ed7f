"""Remote CPU workers on Ray: batches made by Ray actors on other machines' cores, beside the local threads.

Each worker is a Ray actor (``remote_workers.Maker``) holding its own runner of the pipeline's CPU placement (it
opens the source itself, so the files must be where the workers can read them). Plans are dealt out in groups
(``remote_deal``): an image plan is a group of its own; a streamed table's group is every plan of
``BUFFERS_PER_GROUP`` consecutive shuffle buffer-fulls (``group_rows``: one buffer-full's rows), so each side
reads and parses only the chunks of the buffer-fulls it makes, and a worker returns a group's batches in one
object (Ray's fixed cost per task and object, paid largely on the trainer's machine, is then paid once per
group rather than once per batch). The local side takes the
share of groups that balances what each side was measured to cost (a table's local groups are made on a
thread of their own, ``remote_local``, and timed there; images keep the local threads' share of the cores).
Where the batch size does not divide a group's rows, a batch straddles two groups and whoever makes it reads
both: each side is then dealt ``STRADDLE_RUNS`` consecutive groups at a time, reading one more buffer-full for
that many. Results are taken back in plan order; each side has a few groups to make at once, and the groups dealt
ahead of the trainer are bounded by a window counted in plans (Ray's object store carries the workers'; that
window is the backpressure). Every plan makes its own batch (``SkipFill.PADDING``), so where a plan was made does
not change the batch: batches equal the local loader's, bit for bit, for the same seed (with
``on_error="skip"``, a skipped image's slot is padding in its own batch rather than filled from the next plan's
samples; a table's bad row is an invalid slot in its place either way).

Failures are bounded. Ray restarts a worker whose process dies (``max_restarts=-1``) and sends the groups it
lost again, each at most ``MAX_PLAN_RETRIES`` times (``max_task_retries``): a batch is a pure function of its
plan, so nothing is lost or repeated; a group that kills its worker every time ends in a ``RemoteWorkerError``
naming its samples and the failure. Every wait on Ray is bounded: a batch late by
``RayWorkers.stall_warning_s`` is logged (logger ``feedline``, WARNING, naming the worker and the plan) and
again at that interval; one late by ``batch_timeout_s`` restarts its worker and raises TimeoutError (a table's
batches arrive a buffer-full at a time: the wait is for the buffer-full); workers that cannot start within
``start_timeout_s`` raise TimeoutError. The Loaders of a process share their actors (``remote_workers``).
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
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from ...pipelines.spec import PipelineSpec
from ..errors import Skipped
from ..sampler import BatchPlan
from ..skip_log import SkipLog
from . import remote_workers
from .contract import BatchInfo, Runner, RunnerConfig, SkipFill, StageTimes
from .feature_runner import MAX_PREFETCH
from .remote_deal import Deal, DealCosts, Job
from .remote_local import LocalJob, LocalMaker
from .remote_workers import Shape, Worker, as_arrays

log = logging.getLogger("feedline")

IN_FLIGHT_PER_WORKER = 2  # groups a worker may have to make at once (sent, not yet done), per CPU
LOCAL_IN_FLIGHT = 2  # groups of a table the local side may have to make at once
STRADDLE_RUNS = 2  # consecutive groups dealt to one side where batches straddle them
# A table's buffer-fulls a worker makes per task. Ray's cost per task and object falls mostly on the trainer's
# machine (its process and raylet: submitting, the plans' object, the result's, taking it): some 9 ms a task on
# this machine's cores, over a ms a Criteo batch with one buffer-full (8 batches) a task.
BUFFERS_PER_GROUP = 2
SLOW_WORKER = 1.5  # a worker this many times slower a batch than the local side is dealt twice as far ahead
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
    # "local": a new cluster, not whatever Ray finds on the machine (a stale /tmp/ray/ray_current_cluster
    # or another user's head would otherwise be joined, or refuse our options).
    address = workers.address or os.environ.get("RAY_ADDRESS") or "local"
    _check_reachable(address)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    except Exception as e:  # Ray raises ConnectionError, RuntimeError or its own errors, depending on the cause
        where = repr(address) if address != "local" else "a new local cluster"
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


def object_store_seconds(ray, batch: dict | list[dict], device: torch.device, repeats: int = 5, per_object: int = 1
                         ) -> tuple[float, float]:
    """What a remote batch like ``batch`` costs on each side, per batch, the medians of ``repeats``: putting it
    into Ray's object store (a worker's task return is serialised the same way), and taking it out as tensors
    on ``device`` (the trainer's side), ``per_object`` batches to an object as the workers return them
    (``batches_per_group``). ``batch`` may instead be a group's batches as a runner made them (distinct
    batches, held at once: their shared outputs then cross once, as a worker's do); one batch is copied
    ``per_object`` times, so that none of its memory is taken for shared. Both happen in this process, so a
    cross-machine transfer, which Ray overlaps with the worker's next batches, is in neither."""
    if isinstance(batch, list):
        shared: dict = {}
        arrays = [as_arrays(each, shared) for each in batch]
        per_object = len(arrays)
    else:
        arrays = [_copy(as_arrays(batch)) for _ in range(per_object)]
    put, take = [], []
    ray.get(ray.put(arrays), timeout=_GET_TIMEOUT_S)  # untimed: a new store's first objects cost more
    for _ in range(repeats):
        started = time.perf_counter()
        ref = ray.put(arrays)
        stored = time.perf_counter()
        for each in ray.get(ref, timeout=_GET_TIMEOUT_S):
            _to_torch(each, device)
        put.append((stored - started) / per_object)
        take.append((time.perf_counter() - stored) / per_object)
        del ref
    return statistics.median(put), statistics.median(take)


def _copy(value):
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def batches_per_group(group_rows: int | None, batch_size: int) -> int:
    """Plans in one group of the deal: ``BUFFERS_PER_GROUP`` buffer-fulls' (``group_rows``: a buffer-full's rows;
    None: every plan alone)."""
    return 1 if group_rows is None else max(-(-group_rows * BUFFERS_PER_GROUP // batch_size), 1)


class RemoteRunner:
    """The Runner contract over a local runner and Ray actors (the CPU placement only). The samples either side
    leaves out go to ``skips`` (the Loader's log; default: one of its own): the workers' as their batches are
    taken, in plan order, and so the local runner's images (it keeps a log of its own); a table's bad rows met
    locally go there when met, through the source that the local runner shares with the Loader."""

    def __init__(self, spec: PipelineSpec, source, config: RunnerConfig, workers: RayWorkers, make_local, *,
                 group_rows: int | None = None, skips: SkipLog | None = None):
        if group_rows is not None and (isinstance(group_rows, bool) or not isinstance(group_rows, int)
                                       or group_rows < 1):
            raise ValueError(f"group_rows must be a positive number of rows (a shuffle buffer-full) or None, "
                             f"got {group_rows!r}")
        self.ray = connect(workers)
        self.workers = workers
        self.source = source
        self.buffer_rows = group_rows
        self.group_rows = None if group_rows is None else group_rows * BUFFERS_PER_GROUP  # rows a group spans
        self.group_plans = batches_per_group(group_rows, config.batch_size)
        config = dataclasses.replace(config, skip_fill=SkipFill.PADDING)
        # A worker's runner queues a whole group at once, and its output buffers stay taken until the group's
        # results have been copied into the object store: its prefetch (and so its ring) covers a group.
        worker_config = dataclasses.replace(config, num_threads=workers.cpus_per_worker,
                                            prefetch=min(self.group_plans, MAX_PREFETCH))
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
            # A table's local groups are made ahead of the trainer, LOCAL_IN_FLIGHT at most: the local runner's
            # output buffers (kept in rotation, as many as its prefetch allows) cover them.
            self.local: Runner = make_local(config if self.group_plans == 1 else dataclasses.replace(
                config, prefetch=max(config.prefetch, min(self.group_plans, MAX_PREFETCH))))
            keep_threads = getattr(self.local, "keep_threads", None)
            if self.group_plans > 1 and callable(keep_threads):  # run once per group, or run of groups
                keep_threads()
        except BaseException:
            self._release()
            raise
        # Where batches straddle groups, each side is dealt runs of them.
        self.runs = 1 if self.group_rows is None or self.group_rows % config.batch_size == 0 else STRADDLE_RUNS
        self.in_flight = [IN_FLIGHT_PER_WORKER * workers.cpus_per_worker] * len(self.team)
        self.costs = DealCosts(config.num_threads, len(self.team), workers.cpus_per_worker)
        self.device = config.device
        # Plans dealt ahead of the one delivered next (twice as many where workers are slow: _slow_workers).
        self.window = (sum(self.in_flight) + LOCAL_IN_FLIGHT) * self.runs * self.group_plans
        # A table's bad rows are listed by every process that reads their chunk: the log lists each once.
        self.skips = SkipLog() if skips is None else skips
        self._local_noted = 0  # of the local runner's skips, those already noted
        self.remote_batches = 0
        self.wait_seconds = 0.0       # waiting for a worker's batch to be made and to arrive
        self.transfer_seconds = 0.0   # taking an arrived batch out of the object store, as tensors
        self.remote_seconds = 0.0     # the workers' own time making their batches
        self.deal: Deal | None = None

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

    def group_of(self, plan: BatchPlan) -> tuple[int, int] | None:
        """The deal's group of ``plan``: its epoch and group of buffer-fulls (by its first position); None: alone."""
        return None if self.group_rows is None else (plan.epoch, plan.start // self.group_rows)

    @property
    def local_share(self) -> float:
        """The share of groups made locally now (see ``remote_deal``)."""
        return self.costs.share()

    def batches(self, plans: Iterator[BatchPlan]) -> Iterator[tuple[dict, BatchInfo]]:
        # A table's local groups are made on a thread of their own (and timed); images stream through the local
        # runner as before, in the share of its threads.
        maker = LocalMaker(self.local, self.costs.local_group) if self.group_plans > 1 else None
        deal = Deal(plans, self.group_of, self.costs.share, self._send, self.in_flight,
                    keep=maker.add if maker is not None else None,
                    local_unfinished=LOCAL_IN_FLIGHT if maker is not None else None, runs=self.runs)
        self.deal = deal  # the deal of the stream running now (what each side has to make: ``deal.working``)
        local = self.local.batches(deal.local_plans()) if maker is None else None
        try:
            while True:
                window = self.window * (2 if self._slow_workers() else 1)
                while len(deal.order) < window and deal.pull():
                    pass
                if not deal.order:
                    return
                entry = deal.order.popleft()
                if entry is None:
                    batch, info = next(local)
                    self._note_local()
                    yield batch, info
                    continue
                job, k = entry
                if isinstance(job, LocalJob):
                    batch, info = maker.take(job, k)
                    skipped = ()
                else:
                    batch, info, skipped = self._take(job, k)
                    info = BatchInfo(*info[:4])
                self._note_local()
                self._note([Skipped(*s) for s in skipped])
                yield batch, info
        finally:
            if local is not None:
                local.close()
            if maker is not None:
                maker.close()
            # Groups sent ahead are left to finish, not cancelled: cancelling an actor's task that is still
            # queued on this side can leave a gap in the actor's task sequence, on which Ray makes its later
            # tasks wait (30 s) before giving up on it.

    def _slow_workers(self) -> bool:
        """Whether a worker was measured slower a batch than the local side by ``SLOW_WORKER``: its buffer-fulls
        then take long enough that the deal must look further ahead for them to be made in time."""
        local_s = self.costs.local_s
        return local_s is not None and any(s is not None and s > SLOW_WORKER * local_s for s in self.costs.worker_s)

    def _send(self, worker: int, plans: list[BatchPlan]) -> Job:
        ref = self.team[worker].actor.make_many.remote(self.key, self._box, plans)
        job = Job(tuple(plans), worker, ref, ref.future(), time.perf_counter())
        job.future.add_done_callback(lambda _, job=job: setattr(job, "done", time.perf_counter()))
        return job

    def _take(self, job: Job, k: int) -> tuple[dict, tuple, list]:
        """The job's ``k``-th batch as tensors; its group's results are waited for at most ``batch_timeout_s``
        (Ray's retries included) when its first batch is due. A group that stopped at an error returned the
        batches before it: the plans from there on are sent again to its worker when the first of them is due,
        so that the error (Ray's or the plan's own) is raised in its place, after the batches before it."""
        if job.rest is not None and k >= job.rest_from:
            return self._take(job.rest, k - job.rest_from)
        started = time.perf_counter()
        if job.results is None:
            self._wait(job)
            ready = time.perf_counter()
            try:
                job.results = job.future.result(timeout=_GET_TIMEOUT_S)
            except _worker_failures(self.ray) as e:
                raise self._failure(job, e) from None
            job.future = None  # (it holds the results too)
            self.costs.worker_group(job.worker, len(job.results), job.sent, job.done or ready)
            self.wait_seconds += ready - started
            started = ready
        if k >= len(job.results):  # (made alone, its error comes back through Ray)
            job.rest_from = len(job.results)
            job.rest = self._send(job.worker, list(job.plans[job.rest_from:]))
            return self._take(job.rest, k - job.rest_from)
        arrays, info, skipped, pid = job.results[k]
        job.results[k] = None  # the trainer's tensors alone hold the batch from now on
        batch = _to_torch(arrays, self.device)
        self.team[job.worker].pid = pid
        taken = time.perf_counter() - started
        self.costs.received(taken)
        self.transfer_seconds += taken
        self.remote_seconds += info[4]
        self.remote_batches += 1
        return batch, info, skipped

    def _note_local(self) -> None:
        new = self.local.skipped[self._local_noted:]
        self._local_noted += len(new)
        self._note(new)

    def _wait(self, job: Job) -> None:
        """Until the job's result (or its failure) is here: logged each ``stall_warning_s`` it is late, a
        TimeoutError after ``batch_timeout_s``."""
        limit, every = self.workers.batch_timeout_s, self.workers.stall_warning_s
        began = time.monotonic()
        warn_at = every
        while True:
            waited = time.monotonic() - began
            if waited >= limit:
                self._stalled(job, waited)
            done, _ = futures.wait([job.future], timeout=max(min(warn_at, limit) - waited, 0.0))
            if done:
                return
            waited = time.monotonic() - began
            if warn_at <= waited < limit:
                log.warning("feedline: %s has not returned %s for %.1f s; the Loader gives up at %g s "
                            "(RayWorkers.batch_timeout_s)", self._worker(job.worker),
                            describe_plans(job.plans, self.source), waited, limit)
                warn_at += every

    def _stalled(self, job: Job, waited: float) -> None:
        """A batch past the hard limit: restart its worker (so that it holds no other Loader either; the plan,
        cancelled first, is not sent again) and raise."""
        worker = self._worker(job.worker)
        self._cancel(job.ref)
        try:
            self.ray.kill(self.team[job.worker].actor, no_restart=False)
        except Exception:
            pass
        raise TimeoutError(f"{worker} did not return {describe_plans(job.plans, self.source)} within "
                           f"{waited:.0f} s (RayWorkers.batch_timeout_s={self.workers.batch_timeout_s:g}); the "
                           f"worker was restarted")

    def _failure(self, job: Job, error: Exception) -> RemoteWorkerError:
        """The job's worker died making it, and again each time Ray sent it again (or its result was lost)."""
        text = " ".join(str(error).split())
        if isinstance(error, self.ray.exceptions.ObjectLostError):
            return RemoteWorkerError(f"the batch that {self._worker(job.worker)} made from "
                                     f"{describe_plans(job.plans, self.source)} was lost before it was taken (its "
                                     f"machine or the trainer's store failed). Ray's error: {type(error).__name__}: "
                                     f"{text[:600]}")
        return RemoteWorkerError(
            f"{self._worker(job.worker)} failed making {describe_plans(job.plans, self.source)}: Ray restarts a "
            f"worker whose process ends and sends it the plans again, at most MAX_PLAN_RETRIES={MAX_PLAN_RETRIES} "
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

    @property
    def skipped(self) -> list[Skipped]:
        return self.skips.skipped

    def _note(self, skips) -> None:
        self.skips.add_all(skips)

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
    return describe_plans((plan,), source, shown)


def describe_plans(plans, source, shown: int = 3) -> str:
    """As ``describe_plan``, for a group of consecutive plans: ``batches 8 to 15 of epoch 0 (samples ...)``."""
    plans = list(plans)
    indices = [int(i) for plan in plans for i in plan.indices[plan.valid]]
    first = indices[:shown]
    more = f" and {len(indices) - shown} more" if len(indices) > shown else ""
    head, tail = plans[0], plans[-1]
    which = f"batch {head.batch} of epoch {head.epoch}" if len(plans) == 1 else \
        f"batches {head.batch} to {tail.batch} of epoch {head.epoch}" if head.epoch == tail.epoch else \
        f"batches {head.batch} of epoch {head.epoch} to {tail.batch} of epoch {tail.epoch}"
    text = f"{which} (samples {', '.join(map(str, first))}{more}"
    where = getattr(source, "where", None)
    if callable(where) and first:
        try:
            text += ": " + ", ".join(where(i) for i in first) + (", ..." if more else "")
        except Exception:  # naming is best effort: the error being reported matters more
            pass
    return text + ")"


def _to_torch(value, device: torch.device):
    """A worker's batch as tensors on ``device``, without copying on the host: the tensors are views of the
    arrays in Ray's object store, which stay there while the tensors live. NumPy marks them read-only because
    other readers could share an object; a group's object has one reader, the trainer, and the store's memory
    is mapped writable here, so the trainer may write to its batch (as to a local one: the outputs every batch
    of a size shares, a table's sparse lengths and offsets, are shared by the batches of a group, as the local
    runner's batches share them)."""
    with warnings.catch_warnings():  # (once a batch: entering it costs as much as a conversion)
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return _tensors(value, device)


def _tensors(value, device: torch.device):
    if isinstance(value, np.ndarray):
        tensor = torch.from_numpy(value)
        return tensor if device.type == "cpu" else tensor.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {k: _tensors(v, device) for k, v in value.items()}
    return value
