"""How many remote workers to add to a CPU-bound plan, from the plan's measured CPU cost per batch and the
measured cost of a batch through Ray's object store (a worker puts it in, the trainer's side takes it out).

Two deals (``runners.remote_deal``). Images: the ``L`` local threads make their share of the cores, ``L`` of
every ``L + R`` batches, and the remote cores ``R``; the local threads also receive every remote batch (take it
out of the object store as tensors), ``t_x`` seconds each, so one round takes ``max((L*t_b + R*t_x) / L,
t_b + t_p)`` seconds for ``L + R`` batches of ``t_b`` CPU seconds each (``t_p``: a worker's putting one into
the store). Tables: the local side takes the share of buffer-fulls that balances the two sides' measured costs,
so the workers make all they can, ``R / (t_b + t_p)`` batches a second, up to what the local cores can receive
(``L / t_x``), and the local cores make batches with the time receiving leaves them
(``runners.remote_deal.balanced_rates``). Either way adding cores pays while ``t_x < t_b``; past the point where
receiving saturates the local threads it stops paying, so the fewest workers within ``ENOUGH`` of the best are
used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..runners.remote import RayWorkers, available_workers, batches_per_group, connect, object_store_seconds
from ..runners.remote_deal import balanced_rates
from .decision import PlacementDecision

ENOUGH = 0.95


@dataclass(frozen=True)
class RemoteDecision:
    workers: int                  # remote workers to use; 0: none
    samples_per_s: float          # predicted with them
    local_samples_per_s: float    # predicted without
    batch_s: float                # CPU seconds to make one batch
    transfer_s: float             # local seconds to receive one remote batch out of the object store
    why: str
    put_s: float = 0.0            # a worker's seconds to put one batch into the object store


def rate(local_threads: int, remote_cores: int, batch_s: float, transfer_s: float, batch_size: int, *,
         put_s: float = 0.0, balanced: bool = False) -> float:
    """Samples per second with ``local_threads`` local and ``remote_cores`` remote cores (see the module);
    ``balanced``: the tables' deal, else the images'."""
    if remote_cores == 0:
        return local_threads * batch_size / batch_s
    if balanced:
        local, remote = balanced_rates(local_threads, batch_s / local_threads, transfer_s,
                                       [1.0 / (batch_s + put_s)] * remote_cores)
        return (local + remote) * batch_size
    round_s = max((local_threads * batch_s + remote_cores * transfer_s) / local_threads, batch_s + put_s)
    return (local_threads + remote_cores) * batch_size / round_s


def decide(plan: PlacementDecision, *, workers: int, cpus_per_worker: int, available_workers: int, transfer_s: float,
           put_s: float = 0.0, balanced: bool = False) -> RemoteDecision:
    """Remote workers for ``plan`` (the CPU placement, profiled locally): none unless the CPU is its
    bottleneck, at most ``available_workers`` (those the cluster has CPUs for on other machines).
    ``balanced``: the deal balances the two sides (tables dealt by shuffle buffer-full)."""
    batch_size = plan.batch_size
    batch_s = plan.prediction.cpu_core_s_per_sample * batch_size
    local = rate(plan.threads, 0, batch_s, transfer_s, batch_size)

    def none(why: str) -> RemoteDecision:
        return RemoteDecision(0, local, local, batch_s, transfer_s, why, put_s)

    if plan.prediction.bottleneck not in ("cpu", "thread"):  # a worker has its own batch thread too
        return none(f"not used: the plan is bound by {plan.prediction.bottleneck}, not the CPU")
    if available_workers < 1:
        return none(f"not used: the Ray cluster has no {cpus_per_worker} free CPU(s) for a worker on another "
                    f"machine (workers on this one would take the local threads' cores)")
    if transfer_s >= batch_s:
        return none(f"not used: receiving a batch ({transfer_s * 1e3:.1f} ms) costs the trainer's host as much "
                    f"as making it ({batch_s * 1e3:.1f} ms)")
    usable = min(workers, available_workers)
    rates = [rate(plan.threads, k * cpus_per_worker, batch_s, transfer_s, batch_size, put_s=put_s,
                  balanced=balanced) for k in range(usable + 1)]
    chosen = next(k for k, r in enumerate(rates) if r >= ENOUGH * rates[-1])
    if chosen == 0:
        return none(f"not used: a worker's batch ({(batch_s + put_s) * 1e3:.1f} ms with {put_s * 1e3:.2f} ms to put "
                    f"it into the object store) adds less than {1 / ENOUGH - 1:.0%} to the local threads' rate")
    capped = f" (the cluster has CPUs for {available_workers} of {workers})" if available_workers < workers else ""
    more = "" if chosen == usable else f"; more would wait on the {plan.threads} local threads receiving batches"
    deal = "buffer-fulls dealt in the balanced share" if balanced else "batches dealt in the cores' share"
    return RemoteDecision(chosen, rates[chosen], local, batch_s, transfer_s, (
        f"used: the plan is bound by the CPU; {chosen} worker(s){capped} predicted {rates[chosen]:,.0f} samples/s "
        f"against {local:,.0f} locally ({deal}; a batch costs {batch_s * 1e3:.1f} ms to make, "
        f"{put_s * 1e3:.2f} ms to put into the object store and {transfer_s * 1e3:.2f} ms to receive){more}"), put_s)


def remote_report(requested, used, decision: RemoteDecision | None) -> dict:
    """The remote part of ``Loader.plan``: workers asked for (``RayWorkers``), those used (or None) and why."""
    out = {"workers": requested.num_workers, "cpus_per_worker": requested.cpus_per_worker,
           "used_workers": used.num_workers if used is not None else 0}
    if decision is None:
        out["why"] = "used: a fixed CPU placement runs on every worker asked for"
        return out
    out.update(why=decision.why, predicted_samples_per_s=decision.samples_per_s,
               predicted_local_samples_per_s=decision.local_samples_per_s,
               batch_seconds=decision.batch_s, receive_seconds=decision.transfer_s, put_seconds=decision.put_s)
    return out


def measure_and_decide(plan: PlacementDecision, remote: RayWorkers, sample_batch: Callable[[], dict],
                       device: torch.device, group_rows: int | None) -> RemoteDecision:
    """``decide`` from measurements: a batch of ``plan`` (``sample_batch()``, made locally) timed through the
    object store of the cluster ``remote`` joins, as many to an object as the workers return (a group of
    buffer-fulls of ``group_rows`` for a table: ``batches_per_group``), and the workers the cluster has room for."""
    ray = connect(remote)
    sample = sample_batch()
    group = batches_per_group(group_rows, plan.batch_size)
    put_s, take_s = object_store_seconds(ray, sample, device, per_object=group)
    return decide(plan, workers=remote.num_workers, cpus_per_worker=remote.cpus_per_worker,
                  available_workers=available_workers(ray, remote), transfer_s=take_s,
                  put_s=put_s if group > 1 else 0.0, balanced=group > 1)
