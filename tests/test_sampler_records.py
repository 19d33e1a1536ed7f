"""BatchPlan (loader.sampler) and BatchInfo (runners.contract) are frozen dataclasses whose ``__init__`` writes the
fields straight into the instance (one per batch on the batch thread, where the dataclass's own calls
object.__setattr__ per field): they take the same arguments, hold the same fields, and behave as frozen
dataclasses do (equality, hash, repr, replace, pickling, no assignment), a subclass (MixPlan) included."""
import dataclasses
import inspect
import pickle

import numpy as np
import pytest

from feedline.loader.runners.contract import BatchInfo
from feedline.loader.sampler import BatchPlan
from feedline.loader.sources.mixed import MixPlan


@pytest.mark.parametrize("cls", [BatchPlan, BatchInfo])
def test_init_takes_the_fields_in_order_with_their_defaults(cls):
    params = list(inspect.signature(cls).parameters.values())
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
                                           for f in fields]


def test_batch_info_behaves_as_a_frozen_dataclass():
    info = BatchInfo(2, 8192, False)
    assert (info.epoch, info.end, info.last, info.skipped) == (2, 8192, False, 0)
    assert info == BatchInfo(2, 8192, False, 0) == BatchInfo(epoch=2, end=8192, last=False)
    assert info != BatchInfo(2, 8192, True) and hash(info) == hash(BatchInfo(2, 8192, False))
    assert repr(info) == "BatchInfo(epoch=2, end=8192, last=False, skipped=0)"
    assert dataclasses.replace(info, skipped=3) == BatchInfo(2, 8192, False, skipped=3)
    assert dataclasses.astuple(info) == (2, 8192, False, 0) and pickle.loads(pickle.dumps(info)) == info
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.end = 1
    with pytest.raises(TypeError):
        BatchInfo(1, 2)


def test_batch_plan_behaves_as_a_frozen_dataclass():
    indices, valid = np.arange(4, dtype=np.int64), np.ones(4, bool)
    plan = BatchPlan(indices, valid, 3, 8, False, 1, 100)
    assert plan.indices is indices and plan.valid is valid
    assert (plan.epoch, plan.start, plan.last, plan.batch, plan.shard) == (3, 8, False, 1, 100)
    alone = BatchPlan(indices, valid)
    assert (alone.epoch, alone.start, alone.last, alone.batch, alone.shard) == (0, 0, True, 0, None)
    other = dataclasses.replace(plan, batch=2)
    assert other.batch == 2 and other.indices is indices and other.shard == 100
    back = pickle.loads(pickle.dumps(plan))
    assert back.indices.tolist() == [0, 1, 2, 3] and (back.epoch, back.start, back.shard) == (3, 8, 100)
    assert repr(alone).startswith("BatchPlan(indices=array([0, 1, 2, 3]), valid=array([ True,")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.epoch = 4
    with pytest.raises(TypeError):
        BatchPlan(indices)


def test_a_mix_plan_keeps_its_own_fields_and_the_plan_s():
    plan = MixPlan(np.arange(2), np.ones(2, bool), 1, 2, False, 3, 4, np.array([0, 1]), np.array([5, 6]), None)
    assert (plan.epoch, plan.start, plan.last, plan.batch, plan.shard) == (1, 2, False, 3, 4)
    assert plan.sources.tolist() == [0, 1] and plan.source_epochs.tolist() == [5, 6] and plan.local is None
    assert isinstance(plan, BatchPlan) and dataclasses.replace(plan, batch=9).sources is plan.sources
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.local = 1
