"""A streamed table's plans (StreamOrder.epoch) read their rows from the windows the order keeps made (one lookup
per batch, no call): they are the rows ``positions`` gives for the same stretch on a fresh order, batches that
straddle two windows included, and each plan's arrays are its own (not views of a kept window)."""
import numpy as np
import pytest

from feedline.loader.sampler import LastBatch
from feedline.loader.stream_order import StreamOrder


def _order(**kw):
    rows = np.array([37, 50, 13, 64, 29, 41, 55, 20])  # 309 rows
    return StreamOrder(rows, np.arange(rows.size), kw.pop("batch", 24), seed=5, buffer_rows=kw.pop("buffer", 70), **kw)


@pytest.mark.parametrize("policy", list(LastBatch))
@pytest.mark.parametrize("rank,world", [(0, 1), (1, 2), (2, 3)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_plans_are_the_rows_positions_gives(policy, rank, world, shuffle):
    order = _order(rank=rank, world_size=world, last_batch=policy, shuffle=shuffle)
    for epoch in (0, 1, 0):
        plans = list(order.epoch(epoch))
        assert plans[-1].last and not any(p.last for p in plans[:-1])
        assert sum(p.indices.size for p in plans) == order.per_rank
        for p in plans:
            fresh = _order(rank=rank, world_size=world, last_batch=policy, shuffle=shuffle)
            rows, valid = fresh.positions(epoch, p.start, p.start + p.indices.size)
            assert p.indices.tolist() == rows.tolist() and p.valid.tolist() == valid.tolist()
            assert p.indices.dtype == np.int64 and p.valid.dtype == bool and p.shard == order.per_rank


def test_a_plan_s_arrays_are_its_own():
    order = _order()
    first = next(iter(order.epoch(0)))
    kept = [(rows.copy(), valid.copy()) for _, rows, valid in order._kept_windows]
    first.indices[:] = -1
    first.valid[:] = False
    assert [(r.tolist(), v.tolist()) for _, r, v in order._kept_windows] == [(r.tolist(), v.tolist()) for r, v in kept]
    again = next(iter(order.epoch(0)))
    assert (again.indices >= 0).all() and again.valid.all()


def test_a_resumed_epoch_starts_mid_window_with_the_same_rows():
    order = _order()
    whole = np.concatenate([p.indices for p in order.epoch(2)])
    resumed = list(_order().epoch(2, start_sample=100, first_batch=4))
    assert resumed[0].start == 100 and resumed[0].batch == 4
    assert np.concatenate([p.indices for p in resumed]).tolist() == whole[100:].tolist()
