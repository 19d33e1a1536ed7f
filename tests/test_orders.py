"""Both orders (an exact permutation and a streamed table's chunks) keep the one ``Order`` contract: the same
checks of their arguments, the same share of an epoch per rank, and batches that ``len``, ``shard_size`` and a
resumed epoch agree with."""
import numpy as np
import pytest

from feedline.loader.sampler import EpochSampler, LastBatch, Order
from feedline.loader.stream_order import StreamOrder


def epoch_sampler(n, batch, **kw):
    return EpochSampler(n, batch, **kw)


def stream_order(n, batch, **kw):
    rows = [7] * (n // 7) + ([n % 7] if n % 7 else [])  # chunks of 7 rows, each its own group
    return StreamOrder(rows, list(range(len(rows))), batch, buffer_rows=5, **kw)


ORDERS = [epoch_sampler, stream_order]


@pytest.mark.parametrize("make", ORDERS)
@pytest.mark.parametrize("policy", list(LastBatch))
@pytest.mark.parametrize("n,batch,world", [(37, 4, 3), (10, 3, 2), (64, 8, 1), (29, 5, 4)])
def test_every_order_delivers_what_its_sizes_say(make, policy, n, batch, world):
    valid_seen = []
    for rank in range(world):
        order = make(n, batch, seed=5, rank=rank, world_size=world, last_batch=policy)
        assert isinstance(order, Order)
        plans = list(order.epoch(1))
        assert len(plans) == len(order)
        assert sum(p.indices.size for p in plans) == order.shard_size(1) == order.per_rank
        assert [p.batch for p in plans] == list(range(len(plans)))
        assert [p.last for p in plans] == [False] * (len(plans) - 1) + [True]
        valid_seen += np.concatenate([p.indices[p.valid] for p in plans]).tolist()
        # Resumed from a sample inside a batch: the rest of the same epoch, numbered as asked.
        start = min(2 * batch, order.per_rank - 1) // batch * batch + 1 if order.per_rank > 1 else 0
        rest = list(order.epoch(1, start_sample=start, first_batch=7))
        assert np.array_equal(np.concatenate([p.indices for p in rest]),
                              np.concatenate([p.indices for p in plans])[start:])
        assert rest[0].start == start and rest[0].batch == 7
        assert rest[0].indices.size == min((start // batch + 1) * batch, order.per_rank) - start
        assert [p.batch for p in rest] == list(range(7, 7 + len(rest)))
    assert len(valid_seen) == len(set(valid_seen))
    if policy is LastBatch.DROP:
        assert len(valid_seen) == world * ((n // world) // batch) * batch
    else:
        assert sorted(valid_seen) == list(range(n))


@pytest.mark.parametrize("make", ORDERS)
@pytest.mark.parametrize("kwargs,error,match", [
    ({"batch": 0}, ValueError, "batch_size must be a positive integer, got 0"),
    ({"batch": 2.5}, ValueError, "batch_size must be a positive integer, got 2.5"),
    ({"world_size": 0}, ValueError, "world_size must be a positive integer"),
    ({"rank": 2, "world_size": 2}, ValueError, r"rank must be an integer in \[0, 1\], got 2"),
    ({"rank": True}, ValueError, "rank must be an integer"),
    ({"seed": -1}, ValueError, "seed must be an integer >= 0, got -1"),
    ({"shuffle": 1}, TypeError, "shuffle must be True or False, got 1"),
    ({"last_batch": "sometimes"}, ValueError, "last_batch"),
    ({"batch": 20, "world_size": 2, "last_batch": "drop"}, ValueError,
     "last_batch='drop' with batch_size=20 and 2 rank.s. leaves no batch from 30"),
])
def test_every_order_checks_its_arguments_alike(make, kwargs, error, match):
    kwargs = dict(kwargs)
    batch = kwargs.pop("batch", 4)
    with pytest.raises(error, match=match):
        make(30, batch, **kwargs)


@pytest.mark.parametrize("make", ORDERS)
def test_a_start_past_the_epoch_is_an_error_naming_it(make):
    order = make(30, 4)
    with pytest.raises(ValueError, match="epoch 2 has 30 .* on this rank; cannot start at 31"):
        list(order.epoch(2, start_sample=31))
