"""`feedline bench --remote-workers N`: the same trainer process with and without N Ray workers, on one machine.

The trainer process is pinned to ``local_cores`` of this process's cores (``os.sched_setaffinity``, before Ray
starts, so Ray's own processes share them too), and each worker to the next ``cpus_per_worker`` cores: adding
the workers adds cores the local loader cannot use, as another machine's would. Both loaders use the CPU
placement; they are measured in alternating rounds (median of each), like the other benchmarks. With a trainer
step, each turn of trainer rounds ends with a round of the simulation's own ceiling, as in the criteo bench.

On a machine that allows network traffic on loopback only, run it in a private network namespace (Ray binds
the machine's interface address whenever it has one): ``unshare -rn sh -c 'ip link set lo up && feedline
bench ... --remote-workers 1'`` (``make bench-remote``)."""
from __future__ import annotations

import os
import time

from tqdm import tqdm

from ..loader import Loader, RayWorkers
from ..loader.epochs import endless
from ..loader.runners.remote import object_store_seconds
from ..pipelines.spec import PipelineSpec
from .trainer import (CEILING_NOTE, SPLIT_NOTE, alternate, ceiling_summary, check_trainer_step, counted,
                      free_batches, median_rate, resolve_step_s, trainer_summary)

SETTLE_S = 1.5
CEILING = "trainer ceiling"  # the ceiling rounds' name among the streams of a trainer turn
# The local cluster's object store: bounded, and its memory allocated when Ray starts
# (``preallocate_plasma_memory``). Otherwise each object a worker puts gets pages of its own that the kernel
# allocates and zeroes as they are first written (every page of every group of batches), and gives back when
# the trainer lets go of it. A group of Criteo batches (two buffer-fulls) is some 40 MB; the trainer holds at
# most the runner's window of them.
OBJECT_STORE_BYTES = 1 << 30


def split_cores(cores: list[int], local_cores: int, workers: int, cpus_per_worker: int) -> tuple[list, list]:
    """The trainer's cores and the workers' cores, disjoint, from ``cores``; an error says what is missing."""
    wanted = local_cores + workers * cpus_per_worker
    if len(cores) < wanted:
        raise ValueError(f"--remote-workers {workers} with --cpus-per-worker {cpus_per_worker} and {local_cores} "
                         f"local core(s) needs {wanted} cores on this machine; this process may use {len(cores)} "
                         f"({cores})")
    return cores[:local_cores], cores[local_cores:wanted]


def object_store_options(nbytes: int = OBJECT_STORE_BYTES) -> dict:
    """``ray.init`` arguments for a local cluster whose object store is ``nbytes``, allocated at its start (a
    cluster's nodes: ``RAY_preallocate_plasma_memory=1 ray start --object-store-memory N ...``)."""
    return {"object_store_memory": nbytes, "_system_config": {"preallocate_plasma_memory": True}}


def bench_remote(spec: PipelineSpec, *, batch_size: int, remote_workers: int, cpus_per_worker: int = 1,
                 local_cores: int = 1, address: str | None = None, batches: int = 40, warmup: int = 4,
                 rounds: int = 5, trainer_step_ms: float | str | None = None, progress: bool = True,
                 settle_s: float = SETTLE_S) -> dict:
    import ray
    import torch

    step = check_trainer_step(trainer_step_ms)
    address = address or os.environ.get("RAY_ADDRESS") or None
    local, remote = split_cores(sorted(os.sched_getaffinity(0)), local_cores,
                                remote_workers if address is None else 0, cpus_per_worker)
    os.sched_setaffinity(0, local)
    torch.set_num_threads(local_cores)
    started = time.perf_counter()
    if address is None:
        ray.init(address="local", num_cpus=remote_workers * cpus_per_worker, include_dashboard=False,
                 log_to_driver=False, configure_logging=False, **object_store_options())
    workers = RayWorkers(remote_workers, cpus_per_worker, address, cores=tuple(remote) if address is None else None)
    contenders = {
        "local": Loader(spec, batch_size, placement="cpu", num_threads=local_cores, last_batch="drop"),
        "remote": Loader(spec, batch_size, placement="cpu", num_threads=local_cores, last_batch="drop",
                         remote=workers),
    }
    # Untimed at the start of a turn: what a loader made ahead while it waited (its prefetch queue, and the
    # batches dealt ahead: a window that doubles where the workers are slow, see RemoteRunner._slow_workers).
    untimed = max(c.prefetch + 2 * getattr(c.runner, "window", 0) for c in contenders.values())
    per_round = max(batches // rounds, 2 * untimed)
    phases = 1 if step is None else 2
    total = 2 * (warmup + phases * rounds * (untimed + per_round))
    first_batch_s = {}
    with tqdm(total=total, desc="bench remote", unit="batch", disable=not progress) as bar:
        streams = {name: counted(endless(lambda l=loader: l), lambda: bar.update(1))
                   for name, loader in contenders.items()}
        for name, stream in streams.items():
            began = time.perf_counter()
            next(stream)
            first_batch_s[name] = time.perf_counter() - began
            for _ in range(warmup - 1):
                next(stream)
        runner = contenders["remote"].runner
        runner.transfer_seconds = runner.remote_seconds = runner.wait_seconds = 0.0
        runner.remote_batches = 0
        capacity = alternate(streams, rounds=rounds, per_round=per_round, untimed=untimed, settle_s=settle_s,
                             on_turn=lambda name: bar.set_description(f"bench {name}"))
        loaded, ceiling, step_s = None, None, None
        if step is not None:
            step_s = resolve_step_s(step, capacity["remote"])
            loaded, ceiling = trainer_turns(streams, capacity["remote"][0], rounds=rounds, per_round=per_round,
                                            untimed=untimed, step_s=step_s, settle_s=settle_s,
                                            on_turn=lambda name: bar.set_description(
                                                f"bench {name} + trainer {step_s * 1000:.1f} ms"))
        # A group of batches as a worker makes them (distinct, held at once): what its return puts into Ray's store.
        group = [next(streams["local"]) for _ in range(runner.group_plans)]
        for stream in streams.values():
            stream.close()
    made = max(runner.remote_batches, 1)
    make_s, receive_s = runner.remote_seconds / made, runner.transfer_seconds / made
    serialize_s, _ = object_store_seconds(ray, group, torch.device("cpu"))
    del group
    result = {
        "pipeline": spec.name, "batch_size": batch_size, "dataset_size": len(contenders["local"].source),
        "rounds": rounds, "batches_per_round": per_round, "untimed_batches_per_round": untimed,
        "local_cores": local, "remote_cores": remote if address is None else f"cluster at {address}",
        "remote_workers": remote_workers, "cpus_per_worker": cpus_per_worker,
        "local_samples_per_s": median_rate(capacity["local"]),
        "remote_samples_per_s": median_rate(capacity["remote"]),
        "speedup_per_round": [round(r["samples_per_s"] / l["samples_per_s"], 3)
                              for r, l in zip(capacity["remote"], capacity["local"])],
        "first_batch_s": first_batch_s,
        "remote_batch_ms": {"make": make_s * 1e3, "serialize": serialize_s * 1e3, "receive": receive_s * 1e3,
                            "waited": runner.wait_seconds / made * 1e3},
        "transfer_share": (serialize_s + receive_s) / (make_s + serialize_s + receive_s),
        # The deal at the end (runners.remote_deal): the share of groups made locally, and what each side was
        # measured to take a batch (the local side with the trainer's own work beside it; a worker with putting
        # its batches into the object store and fetching them).
        "deal": {"batches_per_group": runner.group_plans, "local_share": runner.local_share,
                 "local_batch_ms": None if runner.costs.local_s is None else runner.costs.local_s * 1e3,
                 "worker_batch_ms": [None if s is None else s * 1e3 for s in runner.costs.worker_s]},
        "setup_s": time.perf_counter() - started,
    }
    result["speedup"] = result["remote_samples_per_s"] / result["local_samples_per_s"]
    if loaded is not None:
        result.update(trainer_summary(capacity, loaded, step_s, auto=step == "auto", main="remote",
                                      baseline="local"))
        result.update(ceiling_summary(ceiling, step_s))
        result["notes"] = [CEILING_NOTE, SPLIT_NOTE]
    for loader in contenders.values():
        loader.close()
    if address is None:
        ray.shutdown()
    return result


def trainer_turns(streams: dict, like: dict, **alternated) -> tuple[dict[str, list[dict]], list[dict]]:
    """The trainer rounds of ``streams`` (:func:`feedline.benchmarks.trainer.alternate` with ``alternated``), each
    turn ending with a ceiling round: the same trainer, step and batches over a loader that costs nothing, batches
    of the size of the round ``like`` (:func:`feedline.benchmarks.trainer.free_batches`). Returns the streams'
    rounds and the ceiling rounds."""
    runs = alternate({**streams, CEILING: free_batches(like)}, **alternated)
    return runs, runs.pop(CEILING)

