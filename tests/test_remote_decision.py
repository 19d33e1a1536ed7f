"""How many Ray workers placement="auto" adds (loader/placement/remote_decision.py): its rate model against a
simulation of the deal, and its decisions."""
import heapq
from types import SimpleNamespace

import pytest

from feedline.loader.placement.remote_decision import decide, rate


def simulated_rate(local: int, remote: int, batch_s: float, transfer_s: float, batch_size: int,
                   rounds: int = 400) -> float:
    """The deal run out: every round, ``local`` plans made on the local cores and ``remote`` on the remote ones,
    each remote batch then received on a local core; jobs go to the core free first."""
    local_free = [0.0] * local
    remote_free = [0.0] * remote
    for _ in range(rounds):
        for _ in range(local):
            heapq.heappush(local_free, heapq.heappop(local_free) + batch_s)
        for _ in range(remote):
            made = heapq.heappop(remote_free) + batch_s
            heapq.heappush(remote_free, made)
            free = heapq.heappop(local_free)
            heapq.heappush(local_free, max(free, made) + transfer_s)
    end = max(local_free + remote_free)
    return rounds * (local + remote) * batch_size / end


@pytest.mark.parametrize("local,remote,batch_s,transfer_s", [
    (1, 1, 0.1, 0.01), (1, 4, 0.1, 0.02), (2, 2, 0.05, 0.05), (3, 8, 0.02, 0.004), (1, 8, 0.1, 0.03),
])
def test_the_rate_model_matches_the_simulated_deal(local, remote, batch_s, transfer_s):
    assert rate(local, remote, batch_s, transfer_s, 64) == pytest.approx(
        simulated_rate(local, remote, batch_s, transfer_s, 64), rel=0.03)


def simulated_buffer_fulls(local: int, remote: int, batch_s: float, transfer_s: float, put_s: float,
                           batch_size: int, group: int = 8, working: int = 2, groups: int = 300) -> float:
    """The tables' deal run out (runners.remote_deal): buffer-fulls of ``group`` batches dealt in turn to the
    local side or the least busy worker, in the balanced share (error diffusion), each side with at most
    ``working`` buffer-fulls to make at once and the window ``working * (remote + 1) * group`` plans (twice that
    where a worker's batch takes over 1.5 times the local side's); the local side makes its buffer-fulls one
    batch after another on its cores (``batch_s / local`` a batch), a worker its own (``batch_s + put_s`` a
    batch, all returned together); the trainer takes batches in order, and each remote batch costs the local
    cores ``transfer_s / local`` of their time when it is taken."""
    local_s, worker_s = batch_s / local, batch_s + put_s
    share = rate_share(local, local_s, transfer_s, [1 / worker_s] * remote)
    window = working * (remote + 1) * group * (2 if worker_s > 1.5 * local_s else 1)
    worker_free, local_free = [0.0] * remote, 0.0
    side, ready, dealt_at = {}, {}, {}
    order, local_queue = [], []
    credit, now, dealt, taken = 1.0 - share, 0.0, 0, 0

    def unfinished(w):
        return sum(1 for g, s in side.items() if s == w and (ready.get((g, group - 1), float("inf")) > now))

    def deal():
        nonlocal credit, dealt
        g, dealt = dealt, dealt + 1
        credit += share
        room = [w for w in range(remote) if unfinished(w) < working]
        if not room or (credit >= 1 - 1e-9 and unfinished(None) < working):
            credit, side[g] = max(credit - 1, -1.0), None
            local_queue.append(g)
        else:
            w = min(room, key=lambda w: (unfinished(w), worker_free[w]))
            side[g] = w
            worker_free[w] = max(worker_free[w], now) + group * worker_s
            ready.update({(g, k): worker_free[w] for k in range(group)})
        dealt_at[g] = now
        order.extend((g, k) for k in range(group))

    def make_local(until=float("inf"), need=None):
        """The local side's batches, in order, that start before ``until`` (or up to ``need``)."""
        nonlocal local_free
        while local_queue and need not in ready:
            g = local_queue[0]
            k = next(k for k in range(group) if (g, k) not in ready)
            start = max(local_free, dealt_at[g])
            if start >= until:
                return
            local_free = ready[(g, k)] = start + local_s
            if k == group - 1:
                local_queue.pop(0)

    while taken < groups * group:
        while len(order) - taken < window and dealt < groups:
            deal()
        g, k = order[taken]
        if side[g] is None:
            make_local(need=(g, k))
            now = max(now, ready[(g, k)])
        else:
            make_local(ready[(g, k)])
            now = max(now, ready[(g, k)])
            make_local(now)
            local_free = max(local_free, now) + transfer_s / local
            now += transfer_s / local
        taken += 1
    return taken * batch_size / now


def rate_share(local, local_s, transfer_s, worker_rates):
    from feedline.loader.runners.remote_deal import balanced_rates

    made_here, made_there = balanced_rates(local, local_s, transfer_s, worker_rates)
    return made_here / (made_here + made_there)


@pytest.mark.parametrize("local,remote,batch_s,transfer_s,put_s", [
    (1, 1, 0.011, 0.0003, 0.002), (1, 1, 0.011, 0.002, 0.0), (1, 2, 0.011, 0.0003, 0.003), (2, 1, 0.02, 0.001, 0.002),
    (1, 4, 0.011, 0.0003, 0.002), (1, 4, 0.011, 0.0015, 0.003), (1, 8, 0.011, 0.0003, 0.003), (2, 3, 0.02, 0.0, 0.01),
])
def test_the_balanced_rate_model_matches_the_simulated_deal_of_buffer_fulls(local, remote, batch_s, transfer_s, put_s):
    model = rate(local, remote, batch_s, transfer_s, 64, put_s=put_s, balanced=True)
    assert model == pytest.approx(simulated_buffer_fulls(local, remote, batch_s, transfer_s, put_s, 64), rel=0.05)


def test_one_worker_core_beside_the_trainers_gains_what_the_balanced_deal_predicts():
    # Criteo on this machine's cores: 11 ms a batch, 2 ms to put one into the store, 0.3 ms to receive it.
    fixed = rate(1, 1, 0.011, 0.0003, 8192, put_s=0.002)
    balanced = rate(1, 1, 0.011, 0.0003, 8192, put_s=0.002, balanced=True)
    local = rate(1, 0, 0.011, 0.0003, 8192)
    assert balanced / local == pytest.approx(1 + (1 - 0.3 / 11) * 11 / 13 + 0.0, rel=1e-9)
    assert balanced / local > 1.8 > fixed / local  # the cores' share leaves the local core waiting on the worker


def plan(bottleneck="cpu", threads=1, batch_size=64, cpu_s_per_sample=0.1 / 64):
    return SimpleNamespace(batch_size=batch_size, threads=threads,
                           prediction=SimpleNamespace(bottleneck=bottleneck, cpu_core_s_per_sample=cpu_s_per_sample))


def test_no_workers_unless_the_cpu_is_the_bottleneck():
    d = decide(plan("gpu"), workers=4, cpus_per_worker=1, available_workers=4, transfer_s=0.001)
    assert d.workers == 0 and "bound by gpu" in d.why


def test_no_workers_where_the_cluster_has_no_other_machine():
    d = decide(plan(), workers=4, cpus_per_worker=2, available_workers=0, transfer_s=0.001)
    assert d.workers == 0 and "another machine" in d.why


def test_no_workers_where_receiving_costs_as_much_as_making():
    d = decide(plan(), workers=4, cpus_per_worker=1, available_workers=4, transfer_s=0.2)
    assert d.workers == 0 and "receiving a batch" in d.why


def test_all_workers_while_each_adds_throughput():
    d = decide(plan(), workers=3, cpus_per_worker=1, available_workers=3, transfer_s=0.001)
    assert d.workers == 3
    assert d.samples_per_s == pytest.approx(rate(1, 3, 0.1, 0.001, 64))
    assert d.samples_per_s > 3.5 * d.local_samples_per_s


def test_the_fewest_workers_once_receiving_saturates_the_local_threads():
    # Receiving takes a quarter of a batch's making: one local thread saturates at 4 workers' output.
    d = decide(plan(), workers=16, cpus_per_worker=1, available_workers=16, transfer_s=0.025)
    best = rate(1, 16, 0.1, 0.025, 64)
    assert d.samples_per_s >= 0.95 * best
    assert rate(1, d.workers - 1, 0.1, 0.025, 64) < 0.95 * best
    assert d.workers < 16 and "more would wait" in d.why


def test_tables_are_decided_on_the_balanced_deal_with_the_workers_cost_of_putting_batches():
    d = decide(plan(), workers=3, cpus_per_worker=1, available_workers=3, transfer_s=0.001, put_s=0.02, balanced=True)
    assert d.workers == 3 and d.put_s == 0.02
    assert d.samples_per_s == pytest.approx(rate(1, 3, 0.1, 0.001, 64, put_s=0.02, balanced=True))
    assert "buffer-fulls dealt in the balanced share" in d.why and "20.00 ms to put" in d.why
    slow = decide(plan(), workers=3, cpus_per_worker=1, available_workers=3, transfer_s=0.001, put_s=20.0,
                  balanced=True)  # a worker's batch takes 200 times the local one: not worth it
    assert slow.workers == 0 and "adds less than 5%" in slow.why


def test_capped_by_what_the_cluster_has_room_for():
    d = decide(plan(), workers=8, cpus_per_worker=2, available_workers=2, transfer_s=0.001)
    assert d.workers == 2 and "CPUs for 2 of 8" in d.why


def test_the_remote_bench_splits_cores_without_overlap_and_names_what_is_missing():
    from feedline.benchmarks.remote_bench import split_cores

    assert split_cores([0, 1, 2, 3, 4], 1, 2, 2) == ([0], [1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"needs 3 cores on this machine; this process may use 2 \(\[0, 1\]\)"):
        split_cores([0, 1], 1, 1, 2)


class FakeRay:
    """What available_workers asks of Ray: this node's id, the nodes, the free CPUs, the job."""

    def __init__(self, nodes: dict[str, int], free: float):
        self._nodes, self._free = nodes, free

    def get_runtime_context(self):
        return SimpleNamespace(get_node_id=lambda: "here", get_job_id=lambda: "01000000")

    def nodes(self):
        return [{"NodeID": n, "Alive": True, "Resources": {"CPU": cpus}} for n, cpus in self._nodes.items()]

    def available_resources(self):
        return {"CPU": self._free}


def test_workers_this_process_already_runs_elsewhere_count_as_available(monkeypatch):
    # A train Loader's two workers fill the other machine; a val Loader asking for the same kind shares them.
    from feedline.loader import RayWorkers
    from feedline.loader.runners import remote_workers
    from feedline.loader.runners.remote import available_workers

    ray = FakeRay({"here": 8, "there": 4}, free=0)
    workers = RayWorkers(num_workers=2, cpus_per_worker=2)
    assert available_workers(ray, workers) == 0
    pool = remote_workers._Pool([remote_workers.Worker(None, f"actor{i}", "there", "10.0.0.2", 100 + i)
                                 for i in range(2)], {"train"})
    monkeypatch.setitem(remote_workers._pools, (("here", "01000000"), workers.shape), pool)
    assert available_workers(ray, workers) == 2
    assert available_workers(ray, RayWorkers(num_workers=2, cpus_per_worker=1)) == 0  # another kind: not shared
    ray._free = 2  # room for one more of 2 CPUs, but the other machine has 4 in all
    assert available_workers(ray, workers) == 2
