"""The Ray actors that make remote batches, and the pool that shares them between the Loaders of a process.

A worker (``Maker``) is a Ray actor of ``cpus_per_worker`` CPUs. It hosts any number of pipelines, each under
the key of the runner that uses it (a train and a val pipeline, say), and makes one group of plans at a time
(one plan of images; every plan of a table's group of shuffle buffer-fulls), returning the group's batches
together.
A runner sends its pipeline (declaration, CPU placement, cache size) once into Ray's object store and passes
the reference with every group, so a worker that Ray restarted after a crash opens the pipeline again on its
own the first time it is asked for a batch of it.

The pool keys actors by the Ray session and the workers' shape (address, CPUs per worker, cores): every
runner of this process that asks for workers of one shape takes the pool's first ``num_workers`` actors
(more are started when one asks for more than the pool holds), and when the last runner using the pool
closes, its actors end. A train and a val Loader given the same ``RayWorkers`` thus use one set of actors
in turn, on a cluster with room for one set.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..sampler import BatchPlan

MAX_PLAN_RETRIES = 3  # times Ray sends a plan again after its worker died (a crash, OOM, a kill) making it


@dataclass(frozen=True)
class Shape:
    """What makes two requests for workers interchangeable."""

    address: str | None
    cpus_per_worker: int
    cores: tuple[int, ...] | None


@dataclass
class Worker:
    """One actor of a pool and what is known of it: ``pid`` is updated with every batch it returns (a
    restarted actor runs in a new process)."""

    actor: Any
    actor_id: str
    node_id: str
    node_ip: str
    pid: int

    def describe(self, number: int, of: int) -> str:
        return f"Ray worker {number} of {of} (actor {self.actor_id[:12]} on {self.node_ip}, last seen as pid {self.pid})"


@dataclass
class _Pool:
    workers: list[Worker] = field(default_factory=list)
    users: set[str] = field(default_factory=set)


_pools: dict[tuple, _Pool] = {}
_lock = threading.RLock()  # re-entrant: a runner's finaliser may run while this thread holds it


def _session(ray) -> tuple[str, str]:
    context = ray.get_runtime_context()
    return context.get_node_id(), context.get_job_id()


def acquire(ray, shape: Shape, count: int, start_timeout_s: float, user: str) -> list[Worker]:
    """The first ``count`` workers of ``shape``'s pool for ``user``, starting those the pool lacks and waiting
    at most ``start_timeout_s`` for them; a cluster without room for them is a TimeoutError, not a hang."""
    with _lock:
        session = _session(ray)
        for key in [k for k in _pools if k[0] != session]:  # left by an earlier Ray session: its actors are gone
            del _pools[key]
        pool = _pools.setdefault((session, shape), _Pool())
        try:
            missing = count - len(pool.workers)
            if missing > 0:
                pool.workers += _start(ray, shape, missing, start_timeout_s, count, running=len(pool.workers))
        except BaseException:
            if not pool.users and not pool.workers:
                del _pools[(session, shape)]
            raise
        pool.users.add(user)
        return pool.workers[:count]


def _start(ray, shape: Shape, missing: int, start_timeout_s: float, count: int, running: int) -> list[Worker]:
    maker = ray.remote(Maker).options(num_cpus=shape.cpus_per_worker, max_restarts=-1,
                                       max_task_retries=MAX_PLAN_RETRIES)
    actors = [maker.remote(shape.cores) for _ in range(missing)]
    pending = [actor.hello.remote() for actor in actors]
    ready, waiting = ray.wait(pending, num_returns=len(pending), timeout=start_timeout_s)
    try:
        if waiting:
            held = f"; {running} worker(s) of this shape already run for other Loaders of this process" \
                if running else ""
            raise TimeoutError(f"{len(waiting)} of {count} Ray workers of {shape.cpus_per_worker} CPU(s) did not "
                               f"start within {start_timeout_s:g} s (RayWorkers.start_timeout_s): the cluster has "
                               f"{ray.available_resources().get('CPU', 0):g} free CPUs{held}")
        hellos = ray.get(ready, timeout=start_timeout_s)  # an actor that failed to start raises its error here
    except BaseException:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        raise
    return [Worker(actor, *hello) for actor, hello in zip(actors, hellos)]


def release(ray, shape: Shape, user: str) -> None:
    """``user`` no longer needs its workers: its pipeline leaves them, and the last user of a pool ends its
    actors."""
    with _lock:
        try:
            key = (_session(ray), shape)
        except Exception:  # Ray was shut down: its actors went with it
            return
        pool = _pools.get(key)
        if pool is None or user not in pool.users:
            return
        pool.users.discard(user)
        if pool.users:
            for worker in pool.workers:
                worker.actor.forget.remote(user)
            return
        del _pools[key]
        for worker in pool.workers:
            ray.kill(worker.actor, no_restart=True)


def running_elsewhere(ray, shape: Shape, here: str) -> int:
    """Workers of ``shape`` this process already runs on machines other than node ``here``."""
    with _lock:
        pool = _pools.get((_session(ray), shape))
        return sum(w.node_id != here for w in pool.workers) if pool else 0


@dataclass
class _Hosted:
    source: Any
    runner: Any
    reported: int = 0  # of the runner's skips, those already returned with a batch


class Maker:
    """The Ray actor: runners of the CPU placement of any number of pipelines, one group of plans at a time."""

    def __init__(self, cores: tuple[int, ...] | None):
        if cores is not None:
            pin_process(cores)
        self.hosted: dict[str, _Hosted] = {}
        self.forgotten: set[str] = set()

    def hello(self) -> tuple[str, str, str, int]:
        import ray

        context = ray.get_runtime_context()
        return context.get_actor_id(), context.get_node_id(), ray.util.get_node_ip_address(), os.getpid()

    def load(self, key: str, box: list) -> int:
        """Open the pipeline in ``box`` (a list holding the object-store reference of ``(spec, config,
        cache_rows)``: a reference in a list reaches the actor unresolved, so it is read only when needed)."""
        if key in self.forgotten:
            raise RuntimeError(f"pipeline {key} was closed on this worker")
        if key not in self.hosted:
            import ray

            from ..sources import open_source
            from . import make_runner

            spec, config, cache_rows = ray.get(box[0])
            source = open_source(spec.source, cache_rows=cache_rows, cache=config.cache)  # a table: converted as parsed
            runner = make_runner(spec, source, config)
            keep_threads = getattr(runner, "keep_threads", None)  # a table runner's, run once per group
            if callable(keep_threads):
                keep_threads()
            self.hosted[key] = _Hosted(source, runner)
        return os.getpid()

    def make_many(self, key: str, box: list, plans: list[BatchPlan]) -> list[tuple[dict, tuple, list, int]]:
        """The batches of ``plans`` (consecutive plans, e.g. a table's group of shuffle buffer-fulls, whose chunks this
        worker then reads alone), returned together as one object: for each, (arrays, (epoch, end, last,
        skipped, seconds making it), the bad samples first met making it, this process's id); only those before
        the first that raised, if one did after the first. The runner's output buffers stay taken while the list
        holds them, until Ray has copied it into the object store, so none is written again before then."""
        self.load(key, box)
        hosted = self.hosted[key]
        out = []
        shared: dict = {}  # the group's arrays by the memory they view (see ``as_arrays``)
        started = time.perf_counter()
        try:
            for batch, info in hosted.runner.batches(iter(plans)):  # run to the stream's end: its pipeline is reset
                made = time.perf_counter()
                new = hosted.runner.skipped[hosted.reported:]  # (plan threads may list more meanwhile)
                hosted.reported += len(new)
                skipped = [dataclasses.astuple(s) for s in new]
                out.append((as_arrays(batch, shared), (info.epoch, info.end, info.last, info.skipped, made - started),
                            skipped, os.getpid()))
                started = made
        except Exception:
            if not out:
                raise
            return out  # the batches before the error; the runner asks for the rest again, and meets it then
        if len(out) != len(plans):
            raise RuntimeError(f"the worker's runner made {len(out)} batches of {len(plans)} plans")
        return out

    def forget(self, key: str) -> None:
        self.forgotten.add(key)
        hosted = self.hosted.pop(key, None)
        if hosted is not None:
            hosted.runner.close()
            close = getattr(hosted.source, "close", None)
            if callable(close):
                close()

    def pid(self) -> int:
        return os.getpid()


def pin_process(cores: tuple[int, ...]) -> None:
    """Every thread of this process on ``cores``: ``sched_setaffinity(0)`` pins the calling thread alone (and the
    threads it starts later), so Ray's own threads, started with the process, would stay on the cores it was
    started on (on one machine, the trainer's)."""
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # no procfs: this thread, and those it starts
        threads = [0]
    for thread in threads:
        try:
            os.sched_setaffinity(thread, cores)
        except ProcessLookupError:  # ended meanwhile
            pass


def as_arrays(value, shared: dict | None = None):
    """``value`` with its tensors as NumPy arrays viewing the same memory. With ``shared`` (kept across the
    batches of one group), tensors that view the same memory alike (address, dtype, shape and strides) become one
    array object: pickle, and so Ray, sends an object once however often it appears in the group, so the
    outputs that every batch of a size shares (a table's sparse lengths and offsets: more than half of a Criteo
    batch's bytes) cross once per group rather than once per batch, and the trainer's batches share them as
    the local ones do. Every tensor of the group stays alive until the group is sent, so no address is reused
    meanwhile."""
    if isinstance(value, torch.Tensor):
        array = value.numpy()
        if shared is None:
            return array
        key = (array.__array_interface__["data"][0], array.dtype.str, array.shape, array.strides)
        return shared.setdefault(key, array)
    if isinstance(value, dict):
        return {k: as_arrays(v, shared) for k, v in value.items()}
    return value
