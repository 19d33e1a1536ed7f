"""What the remote workers' deal relies on, without Ray: groups of plans (a table's shuffle buffer-fulls) dealt
whole, in the measured share (loader/runners/remote_deal.py); the local side's groups made on a thread of their
own (remote_local.py); and a table runner that keeps its threads from one run to the next."""
import threading
import time

import numpy as np
import pytest

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader.runners.contract import BatchInfo
from feedline.loader.runners.remote_deal import MIN_REMOTE_SHARE, Deal, DealCosts, Job, balanced_rates
from feedline.loader.runners.remote_local import LocalJob, LocalMaker
from feedline.loader.sampler import BatchPlan
from feedline.loader.stream_order import StreamOrder
from feedline.pipelines.criteo import criteo
from runners import feature_runner


def plans_of(order: StreamOrder, epochs=(0, 1)):
    return [plan for e in epochs for plan in order.epoch(e)]


def named(plans):
    return [(plan.epoch, plan.batch) for plan in plans]


def buffer_full(buffer_rows):
    return lambda plan: (plan.epoch, plan.start // buffer_rows)


class Sides:
    """A fake team: every group sent or kept is recorded with its side; jobs are done when told."""

    def __init__(self, done=False):
        self.dealt = []  # (side, first plan's epoch and batch, plans)
        self.done = done  # jobs done as soon as sent

    def send(self, worker, plans):
        self.dealt.append((worker, plans[0].epoch, plans[0].batch, len(plans)))
        return Job(tuple(plans), worker, None, None, time.perf_counter(), done=1.0 if self.done else None)

    def keep(self, plans):
        self.dealt.append((None, plans[0].epoch, plans[0].batch, len(plans)))
        return LocalJob(tuple(plans))


def deal_all(deal: Deal, finish=True):
    """Pull every group, finishing each job at once (as if made instantly), and return the order dealt."""
    while deal.pull():
        if finish:
            for entry in deal.order:
                job = entry[0]
                if isinstance(job, Job):
                    job.done = 1.0
                else:
                    job.finished = True
    return list(deal.order)


def test_a_buffer_full_is_dealt_whole_to_one_side_in_plan_order():
    order = StreamOrder([700] * 10, list(range(10)), batch_size=128, seed=3, buffer_rows=1024)
    plans = plans_of(order)
    sides = Sides()
    deal = Deal(iter(plans), buffer_full(1024), lambda: 0.5, sides.send, [2, 2], keep=sides.keep, local_unfinished=2)
    entries = deal_all(deal)
    # Every plan once, in order, each in the group of its buffer-full.
    assert named(job.plans[k] for job, k in entries) == named(plans)
    for job, k in entries:
        assert len({(p.epoch, p.start // 1024) for p in job.plans}) == 1
    assert [len(job.plans) for job, k in entries if k == 0] == ([8] * 6 + [7]) * 2  # 7000 rows: 55 batches an epoch
    # Half the groups locally, the rest shared between the two workers, starting locally.
    sides_dealt = [side for side, *_ in sides.dealt]
    assert sides_dealt[0] is None and sides_dealt.count(None) == 7 and {0, 1} <= set(sides_dealt)


def test_the_share_follows_the_measured_costs():
    order = StreamOrder([512] * 64, list(range(64)), batch_size=64, seed=1, buffer_rows=512)
    sides = Sides()
    deal = Deal(iter(plans_of(order, (0,))), buffer_full(512), lambda: 0.75, sides.send, [2], keep=sides.keep,
                local_unfinished=2)
    deal_all(deal)
    local = [side is None for side, *_ in sides.dealt]
    assert len(local) == 64 and sum(local) == 48
    assert all(sum(local[k:k + 4]) == 3 for k in range(0, 64, 4))  # spread evenly, not in bursts


def test_a_side_with_all_its_groups_unfinished_passes_its_turn():
    order = StreamOrder([256] * 16, list(range(16)), batch_size=64, seed=1, buffer_rows=256)
    sides = Sides()
    deal = Deal(iter(plans_of(order, (0,))), buffer_full(256), lambda: 0.5, sides.send, [2], keep=sides.keep,
                local_unfinished=2)
    for _ in range(6):  # nothing is ever done
        assert deal.pull()
    assert [side for side, *_ in sides.dealt] == [None, 0, None, 0, None, None]  # the worker has 2 to make
    assert deal.working(0) == 2 and deal.working(None) == 4  # the local side takes the group when no side has room
    next(job for job, _ in deal.order if isinstance(job, Job)).done = 2.0
    deal.pull()
    assert sides.dealt[-1][0] == 0


def test_where_batches_straddle_buffer_fulls_each_side_makes_runs_of_them():
    order = StreamOrder([1000] * 12, list(range(12)), batch_size=300, seed=2, buffer_rows=1024)
    sides = Sides()
    deal = Deal(iter(plans_of(order, (0,))), buffer_full(1024), lambda: 0.5, sides.send, [2], keep=sides.keep,
                local_unfinished=2, runs=2)
    entries = deal_all(deal)
    assert named(job.plans[k] for job, k in entries) == named(order.epoch(0))
    assert [side for side, *_ in sides.dealt][:8] == [None, None, 0, 0, None, None, 0, 0]


def test_images_stream_their_local_share_through_the_local_runner():
    plans = [BatchPlan(np.arange(4 * b, 4 * b + 4), np.ones(4, bool), 0, 4 * b, False, b) for b in range(9)]
    sides = Sides(done=True)
    deal = Deal(iter(plans), lambda plan: None, lambda: 1 / 3, sides.send, [2, 2])
    local = list(deal.local_plans())
    assert [p.batch for p in local] == [0, 3, 6]
    assert [entry is None for entry in deal.order] == [True, False, False] * 3
    assert [side for side, *_ in sides.dealt] == [0, 1, 0, 1, 0, 1]


def test_balanced_rates_give_the_workers_all_they_make_and_the_local_cores_what_receiving_leaves():
    local, remote = balanced_rates(1, 0.010, 0.001, [50.0, 50.0])
    assert remote == 100.0 and local == pytest.approx((1 - 100 * 0.001) / 0.010)
    local, remote = balanced_rates(2, 0.010, 0.004, [400.0, 400.0])  # receiving saturates the two local cores
    assert remote == pytest.approx(500.0) and local == 0.0


def test_deal_costs_time_a_worker_from_when_it_could_start_each_group():
    costs = DealCosts(1, 1, 1)
    assert costs.share() == 0.5  # nothing measured: the local threads' share of the cores
    costs.worker_group(0, 8, sent=0.0, done=0.16)
    costs.worker_group(0, 8, sent=0.05, done=0.32)  # queued behind the first: from 0.16
    costs.worker_group(0, 8, sent=1.00, done=1.16)  # sent when the worker was idle: from 1.00
    assert costs.worker_s == [pytest.approx(0.48 / 24)]
    assert costs.share() == 0.5  # the local side is not measured yet
    costs.local_group(8, 0.08)
    local, remote = balanced_rates(1, 0.01, 0.0, [1 / 0.02])
    assert costs.share() == pytest.approx(local / (local + remote)) == pytest.approx(2 / 3)
    costs.worker_group(0, 8, sent=2.0, done=30.0)  # a stalled worker still gets its minimum share
    assert costs.share() == 1 - MIN_REMOTE_SHARE


class Scripted:
    """A runner whose batch for a plan is its batch number, failing at the plans named."""

    def __init__(self, fail=()):
        self.fail = set(fail)
        self.runs = 0

    def batches(self, plans):
        self.runs += 1
        for plan in plans:
            if plan.batch in self.fail:
                raise ValueError(f"bad plan {plan.batch}")
            yield plan.batch, BatchInfo(plan.epoch, plan.start + 1, False)


def group(first, n):
    return [BatchPlan(np.array([b]), np.ones(1, bool), 0, b, False, b) for b in range(first, first + n)]


def test_the_local_maker_hands_over_each_groups_batches_in_order_and_times_the_groups():
    timed = []
    maker = LocalMaker(Scripted(), lambda batches, seconds: timed.append(batches))
    jobs = [maker.add(group(4 * g, 4)) for g in range(3)]
    assert [maker.take(job, k)[0] for job in jobs for k in range(4)] == list(range(12))
    maker.close()
    assert timed == [4, 4, 4]
    assert all(job.finished and job.results == [None] * 4 for job in jobs)  # let go of once taken


def test_an_error_in_a_local_group_is_raised_where_its_batch_is_taken():
    maker = LocalMaker(Scripted(fail={6}), lambda *_: None)
    first, second = maker.add(group(0, 4)), maker.add(group(4, 4))
    assert [maker.take(first, k)[0] for k in range(4)] == [0, 1, 2, 3]
    assert [maker.take(second, k)[0] for k in range(2)] == [4, 5]
    with pytest.raises(ValueError, match="bad plan 6"):
        maker.take(second, 2)
    maker.close()


def test_a_table_runner_told_to_keeps_its_threads_from_one_run_to_the_next_and_ends_them_on_close(tmp_path):
    make_criteo(tmp_path / "c.tsv", rows=600, seed=0)
    spec = criteo(str(tmp_path / "c.tsv"))
    runner = feature_runner(spec, num_threads=2)
    runner.keep_threads()
    order = StreamOrder([600], [0], batch_size=100, seed=0)

    def threads_seen():
        seen = set()
        for _ in runner.batches(order.epoch(0)):
            seen |= {t for t in threading.enumerate() if t.name.startswith("feedline-features")}
        return seen

    first, second = threads_seen(), threads_seen()
    assert len(first) == 2 and first == second
    runner.close()
    assert not any(t.is_alive() for t in first)
