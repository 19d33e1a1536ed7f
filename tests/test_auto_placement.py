"""placement="auto" end to end on this machine: profiling, the plan the trainer can read, and a re-plan in
the middle of an epoch that neither loses nor repeats a sample."""
import dataclasses

import pytest

from feedline.loader import Loader
from feedline.loader.devices import gpu_available
from feedline.pipelines import image


def test_auto_profiles_plans_and_covers_the_epoch(image_dir):
    spec = image.train(image_dir, size=48, output="uint8")
    loader = Loader(spec, batch_size=8, placement="auto", seed=2)
    assert loader.plan["status"].startswith("not profiled yet")
    seen = [i for b in loader for i in b["index"].tolist()]
    assert sorted(seen) == list(range(len(loader.source)))
    plan = loader.plan
    assert plan["history"][0]["reason"] == "initial plan" and plan["profile_seconds"] > 0
    assert [s["stage"] for s in plan["stages"]] == [s.name for s in spec.stages]
    assert all(s["cpu_ms_per_batch"] > 0 for s in plan["stages"])
    if not gpu_available():
        assert plan["placement"] == "cpu" and plan["gpu"] is None
        assert all(s["backend"] == "cpu" for s in plan["stages"])
        assert 1 <= plan["threads"] <= plan["cores"]


@pytest.mark.parametrize("at_batch", [1, 3])
def test_a_move_mid_epoch_loses_and_repeats_nothing(image_dir, at_batch):
    spec = image.train(image_dir, size=32, output="uint8")
    loader = Loader(spec, batch_size=4, placement="auto", seed=3)
    reference = [b["index"].tolist() for b in Loader(spec, batch_size=4, placement="cpu", seed=3)]
    calls = {"n": 0}
    auto = loader._auto
    real = auto.delivered

    def delivered(samples):
        real(samples)
        calls["n"] += 1
        if calls["n"] == at_batch:
            return dataclasses.replace(auto.plan, threads=1, prefetch=3)  # as the scheduler would return it
        return None

    auto.delivered = delivered
    batches = [b["index"].tolist() for b in loader]
    assert batches == reference
    assert (loader.num_threads, loader.prefetch) == (1, 3)


def test_static_plan_is_reported(image_dir):
    loader = Loader(image.val(image_dir), batch_size=4, placement="cpu")
    assert loader.plan["placement"] == "cpu" and loader.plan["stages"]["decode"] == "cpu"
