"""The placement controller: every rule that decides where a Loader's stages run, each checked here with a GPU
that is only said to exist (``gpu=True``), scripted readings and synthetic stage costs; and the Loader following
what it decides. Nothing here needs CUDA."""
import warnings

import pytest
import torch

from feedline.loader import Loader, PlacementError, RayWorkers
from feedline.loader.errors import OnError
from feedline.loader.placement import auto as auto_module
from feedline.loader.placement import controller as controller_module
from feedline.loader.placement import remote_decision as remote_module
from feedline.loader.placement.controller import PlacementController
from feedline.loader.placement.measurements import StageCost
from feedline.loader.placement.monitors import CpuReading, GpuReading, ScriptedMonitor
from feedline.loader.placement.profiler import PROBE_SEED, Profile
from feedline.loader.runners import RunnerConfig
from feedline.loader.sampler import EpochSampler
from feedline.pipelines import image

GiB = 2 ** 30
CPU, CUDA = torch.device("cpu"), torch.device("cuda")
SAMPLES = 37
BATCH = 4
# image.train(size=32, output="uint8"): read, decode, random_resized_crop, horizontal_flip; cuts 1 to 4 (4: all
# on the CPU). Per sample: seconds on one CPU thread, on an idle GPU, bytes out. With CPU_WINS the whole pipeline
# on one thread (7 ms) beats cut 3 (the flip on a GPU the trainer leaves 90% of: 8.3 ms); with GPU_WINS the flip
# costs 10 ms on the CPU and cut 3 wins. Decode and crop cost 20 ms on the GPU: cuts 1 and 2 never win.
CPU_WINS = {"read": (0.1e-3, None, 60e3), "decode": (2.9e-3, 20e-3, 150e3),
            "random_resized_crop": (1.0e-3, 20e-3, 32 * 32 * 3), "horizontal_flip": (3.0e-3, 7.5e-3, 32 * 32 * 3)}
GPU_WINS = {**CPU_WINS, "horizontal_flip": (10e-3, 7.5e-3, 32 * 32 * 3)}


@pytest.fixture
def spec(image_dir):
    s = image.train(image_dir, size=32, output="uint8")
    assert s.valid_cuts() == [1, 2, 3, 4] and s.all_cpu == 4
    return s


class Follower:
    """Stands for the Loader: records each configuration the controller hands it."""

    def __init__(self):
        self.configs = []

    def __call__(self, config):
        self.configs.append(config)


class IndexRunner:
    """A runner whose batches hold only their plan's indices; records the configurations it was made for."""

    made = []

    def __init__(self, config):
        IndexRunner.made.append(config)

    def batches(self, plans):
        for plan in plans:
            yield {"index": torch.as_tensor(plan.indices)}, None

    def close(self):
        pass


def orders(batch_size, seed):
    return EpochSampler(SAMPLES, batch_size, seed=seed, shuffle=True)


def attached(controller, *, threads=1, prefetch=2):
    follow = Follower()
    IndexRunner.made = []
    config = RunnerConfig(controller.cut, controller.device, BATCH, 0, threads, prefetch, OnError.RAISE)
    controller.attach(config, runners=IndexRunner, orders=orders, group_rows=None, follow=follow)
    return follow


def scripted(controller, monkeypatch, spec, costs):
    """``controller``'s auto placement profiled as ``costs`` on an idle machine of 2 cores with an idle GPU."""
    stage_costs = tuple(StageCost(s.name, *costs[s.name]) for s in spec.stages)
    monkeypatch.setattr(auto_module, "profile", lambda *args, **kwargs: Profile(stage_costs, 100.0, 12e9, 12, 0.01))
    auto = controller.auto
    auto.cpu = ScriptedMonitor([CpuReading(20.0, 25.0, 2)])
    auto.gpu = ScriptedMonitor([GpuReading(0.1, 60 * GiB, 80 * GiB)])


# ---- the cut and the device, at construction ------------------------------------------------------------------

def test_auto_without_a_gpu_places_every_stage_on_the_cpu(spec):
    c = PlacementController(spec, "auto", device=None, remote=None, gpu=False)
    assert (c.cut, c.device, c.on_gpu) == (spec.all_cpu, CPU, False)


def test_auto_with_a_gpu_starts_at_the_earliest_gpu_cut_and_delivers_on_cuda(spec):
    c = PlacementController(spec, "auto", device=None, remote=None, gpu=True)
    assert (c.cut, c.device, c.on_gpu) == (1, CUDA, True)
    assert set(c.stages.values()) == {"cpu", "gpu"} and c.stages["read"] == "cpu"


def test_a_cuda_device_asked_for_is_kept(spec):
    c = PlacementController(spec, "gpu", device=torch.device("cuda:1"), remote=None, gpu=True)
    assert (c.cut, c.device) == (1, torch.device("cuda:1"))


def test_batches_wanted_on_the_cpu_keep_auto_on_the_cpu_and_its_scheduler_too(spec):
    c = PlacementController(spec, "auto", device=CPU, remote=None, gpu=True)
    assert (c.cut, c.device) == (spec.all_cpu, CPU)
    attached(c)
    assert c.auto.scheduler.valid_cuts == (spec.all_cpu,) and c.auto.gpu_present


def test_without_a_gpu_the_scheduler_weighs_every_cut_and_the_readings_rule_them_out(spec):
    c = PlacementController(spec, "auto", device=None, remote=None, gpu=False)
    attached(c)
    assert c.auto.scheduler.valid_cuts == tuple(spec.valid_cuts()) and not c.auto.gpu_present


def test_a_fixed_gpu_placement_for_batches_wanted_on_the_cpu_is_refused(spec):
    with pytest.raises(PlacementError, match="batches arrive on the GPU; use device='cuda'"):
        PlacementController(spec, "gpu", device=CPU, remote=None, gpu=True)
    with pytest.raises(PlacementError, match="batches arrive on the GPU"):
        PlacementController(spec, {"horizontal_flip": "gpu"}, device=CPU, remote=None, gpu=True)


def test_a_gpu_placement_needs_a_gpu(spec):
    with pytest.raises(PlacementError, match="placement='gpu' needs a CUDA GPU"):
        PlacementController(spec, "gpu", device=None, remote=None, gpu=False)


# ---- remote workers -------------------------------------------------------------------------------------------

def test_remote_workers_run_the_cpu_placement(spec):
    workers = RayWorkers(num_workers=2)
    c = PlacementController(spec, "auto", device=None, remote=workers, gpu=True)
    assert (c.cut, c.device, c.remote_workers) == (spec.all_cpu, CPU, None)  # how many pay: decided at the start
    attached(c)
    assert c.auto.scheduler.valid_cuts == (spec.all_cpu,) and c.auto.gpu_present
    fixed = PlacementController(spec, "cpu", device=None, remote=workers, gpu=True)
    attached(fixed)
    assert fixed.remote_workers is workers and fixed.report()["remote"]["used_workers"] == 2
    with pytest.raises(PlacementError, match="remote workers run the CPU placement of a pipeline; placement 'gpu'"):
        PlacementController(spec, "gpu", device=None, remote=workers, gpu=True)
    with pytest.raises(TypeError, match="remote must be a feedline.loader.RayWorkers, got dict"):
        PlacementController(spec, "cpu", device=None, remote={"num_workers": 2}, gpu=False)


def test_auto_uses_as_many_remote_workers_as_pay_and_the_loader_follows(spec, monkeypatch):
    """A CPU-bound plan (7 ms a sample on its one thread), a batch 0.2 ms to receive: each of 3 workers adds
    nearly a thread's rate, so all 3 are used, measured on a probe batch of the chosen cut."""
    measured = []
    monkeypatch.setattr(remote_module, "connect", lambda workers: "cluster")
    monkeypatch.setattr(remote_module, "available_workers", lambda ray, workers: 8)

    def object_store_seconds(ray, batch, device, per_object):
        measured.append((ray, sorted(batch["index"].tolist()), device, per_object))
        return 0.1e-3, 0.2e-3

    monkeypatch.setattr(remote_module, "object_store_seconds", object_store_seconds)
    c = PlacementController(spec, "auto", device=None, remote=RayWorkers(num_workers=3), gpu=False)
    follow = attached(c)
    scripted(c, monkeypatch, spec, CPU_WINS)
    c.begin()
    probe = sorted(orders(BATCH, PROBE_SEED).epoch(0)[0].indices.tolist())
    assert measured == [("cluster", probe, CPU, 1)]
    assert [(m.cut, m.num_threads, m.seed) for m in IndexRunner.made] == [(spec.all_cpu, 1, PROBE_SEED)]
    assert c.remote_decision.workers == 3 and c.remote_workers == RayWorkers(num_workers=3)
    assert [f.cut for f in follow.configs] == [spec.all_cpu]  # one new runner, to deal batches out
    remote = c.report()["remote"]
    assert remote["used_workers"] == 3 and remote["why"].startswith("used: the plan is bound by the CPU")


# ---- the scheduler's decisions --------------------------------------------------------------------------------

def test_a_decision_equal_to_the_placement_rebuilds_nothing(spec, monkeypatch):
    c = PlacementController(spec, "auto", device=None, remote=None, gpu=False)
    follow = attached(c)
    scripted(c, monkeypatch, spec, CPU_WINS)
    c.begin()
    assert (c.auto.decision.cut, c.auto.decision.threads, c.auto.decision.prefetch) == (spec.all_cpu, 1, 2)
    assert follow.configs == [] and c.report()["history"][0]["reason"] == "initial plan"
    c.begin()  # profiled once
    assert len(c.report()["history"]) == 1


def test_a_decision_that_puts_stages_on_the_gpu_moves_delivery_to_cuda(spec, monkeypatch):
    c = PlacementController(spec, "auto", device=None, remote=None, gpu=False)
    follow = attached(c)
    scripted(c, monkeypatch, spec, GPU_WINS)
    c.begin()
    assert [(f.cut, f.device, f.num_threads, f.prefetch) for f in follow.configs] == [(3, CUDA, 1, 2)]
    assert (c.cut, c.device, c.config) == (3, CUDA, follow.configs[-1])
    assert c.report()["placement"] == spec.describe_cut(3)


# ---- the GPU failing ------------------------------------------------------------------------------------------

def test_a_gpu_failure_under_a_gpu_cut_moves_to_the_cpu_placement_for_good(spec):
    c = PlacementController(spec, "gpu", device=None, remote=None, gpu=True)
    follow = attached(c, threads=3, prefetch=4)
    assert not c.fall_back(ValueError("image data is corrupt"))  # not the GPU: no move
    assert not c.fall_back(RuntimeError("shape mismatch"))
    assert follow.configs == []
    with pytest.warns(RuntimeWarning, match=r"(?s)the GPU failed during placement .gpu.*continuing on the CPU"):
        assert c.fall_back(RuntimeError("CUDA error: an illegal memory access was encountered\nmore"))
    assert [(f.cut, f.num_threads, f.prefetch) for f in follow.configs] == [(spec.all_cpu, 3, 4)]
    assert c.cut == spec.all_cpu and c.auto is None
    assert c.fallbacks == ["gpu -> cpu: RuntimeError: CUDA error: an illegal memory access was encountered"]
    assert c.report()["fallbacks"] == c.fallbacks and c.report()["placement"] == "cpu"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not c.fall_back(torch.cuda.OutOfMemoryError("CUDA out of memory"))  # on the CPU now: raised
    assert len(follow.configs) == 1


def test_a_gpu_failure_under_auto_ends_auto_placement(spec):
    c = PlacementController(spec, "auto", device=None, remote=None, gpu=True)
    attached(c)
    with pytest.warns(RuntimeWarning):
        assert c.fall_back(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert c.auto is None and c.cut == spec.all_cpu
    c.delivered(BATCH)  # nothing left to re-plan
    assert c.report()["placement"] == "cpu"


# ---- the Loader follows ---------------------------------------------------------------------------------------

def test_the_loader_reports_and_delivers_what_its_controller_decides(spec, monkeypatch):
    monkeypatch.setattr(controller_module, "gpu_available", lambda: True)
    loader = Loader(spec, batch_size=BATCH, placement="auto", device="cpu", seed=1)
    assert (loader.cut, loader.device) == (loader.placer.cut, loader.placer.device) == (spec.all_cpu, CPU)
    assert loader.placement == loader.placer.stages and set(loader.placement.values()) == {"cpu"}
    loader.close()
    with pytest.raises(PlacementError, match="batches arrive on the GPU"):
        Loader(spec, batch_size=BATCH, placement="gpu", device="cpu")
    monkeypatch.undo()
    fixed = Loader(spec, batch_size=BATCH, placement="cpu", seed=1, num_threads=2, prefetch=3)
    assert (fixed.num_threads, fixed.prefetch) == (fixed.placer.threads, fixed.placer.prefetch) == (2, 3)
    assert {k: v for k, v in fixed.plan.items() if k != "cache"} == fixed.placer.report()  # (the cache: its own)
    assert fixed.plan["placement"] == "cpu"
    seen = sorted(i for batch in fixed for i in batch["index"].tolist())
    assert seen == list(range(len(fixed.dataset))) and fixed.config.cut == spec.all_cpu
    fixed.close()
    assert fixed.background is None


@pytest.mark.parametrize("placement", ["auto", "cpu"])
def test_a_dropped_loader_is_freed_at_once(spec, placement):
    """The controller holds the Loader's methods weakly: with the cycle collector off, dropping the last reference
    frees the Loader and stops its batch thread (a cycle kept both until the next collection)."""
    import gc
    import threading
    import time
    import weakref

    before = set(threading.enumerate())
    loader = Loader(spec, 4, placement=placement)
    next(iter(loader))
    started = [t for t in set(threading.enumerate()) - before if t.name.startswith("feedline")]
    assert any(t.name == "feedline-batches" for t in started)
    gone = weakref.ref(loader)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del loader
        assert gone() is None
        deadline = time.monotonic() + 5
        while any(t.is_alive() for t in started) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not [t.name for t in started if t.is_alive()]
    finally:
        if enabled:
            gc.enable()
