import numpy as np
import pytest

from feedline.loader.sampler import EpochSampler, LastBatch


def delivered(sampler, epoch=0):
    plans = sampler.epoch(epoch)
    return np.concatenate([p.indices for p in plans]), np.concatenate([p.valid for p in plans]), plans


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("n,batch", [(1, 1), (10, 3), (37, 8), (64, 16)])
def test_one_rank_sees_every_sample_once(n, batch, shuffle):
    idx, valid, plans = delivered(EpochSampler(n, batch, shuffle=shuffle, seed=3))
    assert sorted(idx.tolist()) == list(range(n)) and valid.all()
    assert len(plans) == len(EpochSampler(n, batch, shuffle=shuffle))
    assert all(p.indices.size == batch for p in plans[:-1])


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("policy", list(LastBatch))
@pytest.mark.parametrize("n,batch", [(37, 4), (10, 3), (64, 8), (5, 2)])
def test_shards_cover_dataset_exactly_once(world, policy, n, batch):
    if policy is LastBatch.DROP and (n // world) // batch == 0:
        with pytest.raises(ValueError, match="leaves no batch"):
            EpochSampler(n, batch, world_size=world, last_batch=policy)
        return
    valid_seen, lengths = [], []
    for rank in range(world):
        s = EpochSampler(n, batch, shuffle=True, seed=9, rank=rank, world_size=world, last_batch=policy)
        idx, valid, plans = delivered(s, epoch=2)
        assert len(plans) == len(s)
        lengths.append(len(s))
        valid_seen += idx[valid].tolist()
        if policy is not LastBatch.PARTIAL:
            assert all(p.indices.size == batch for p in plans)
    assert len(valid_seen) == len(set(valid_seen))  # never a duplicate among valid samples
    if policy is LastBatch.DROP:
        assert len(valid_seen) == world * ((n // world) // batch) * batch
        assert len(set(lengths)) == 1
    else:
        assert sorted(valid_seen) == list(range(n))
    assert len(set(lengths)) == 1  # every rank steps the same number of times, whatever the policy


def test_seed_and_epoch_change_the_order():
    a = delivered(EpochSampler(100, 10, seed=1))[0]
    assert (a == delivered(EpochSampler(100, 10, seed=1))[0]).all()
    assert not (a == delivered(EpochSampler(100, 10, seed=2))[0]).all()
    assert not (a == delivered(EpochSampler(100, 10, seed=1), epoch=1)[0]).all()


def test_start_batch_resumes_the_same_epoch():
    s = EpochSampler(50, 7, seed=4)
    full = s.epoch(3)
    tail = s.epoch(3, start_batch=4)
    assert [p.indices.tolist() for p in full[4:]] == [p.indices.tolist() for p in tail]


@pytest.mark.parametrize("kwargs,match", [
    ({"num_samples": 0}, "num_samples"), ({"batch_size": 0}, "batch_size"), ({"batch_size": 2.5}, "batch_size"),
    ({"rank": 2, "world_size": 2}, "rank"), ({"rank": -1}, "rank"), ({"world_size": 0}, "world_size"),
    ({"seed": -1}, "seed"), ({"last_batch": "sometimes"}, "last_batch"),
])
def test_bad_arguments_are_named(kwargs, match):
    args = {"num_samples": 10, "batch_size": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        EpochSampler(args.pop("num_samples"), args.pop("batch_size"), **args)


def test_shuffle_must_be_bool():
    with pytest.raises(TypeError, match="shuffle"):
        EpochSampler(10, 2, shuffle="yes")
