"""The placement model's per-batch costs (forming a batch, the batch thread, the hand-off to the trainer, the
fixed cost of the copies) and stages that block their thread (a sleep, I/O): the prediction follows the
arithmetic on injected measurements, and a stage that sleeps, per sample or per batch, is measured by the time it
holds its thread and bounds the prediction."""
import time
from types import SimpleNamespace

import pytest
import torch

from feedline.loader import Loader
from feedline.loader import profile as profile_module
from feedline.loader.placement.measurements import BatchCosts, Measurements, Resources, StageCost
from feedline.loader.placement.model import PlacementModel
from feedline.loader.placement.profiler import BatchPath, batch_costs_of
from feedline.loader.profile import profile_loader
from feedline.loader.runners.contract import StageTimer, busy_time
from feedline.pipelines import image
from feedline.pipelines.stage import Backend, PlainStage

CPU_ONLY = frozenset({Backend.CPU})
BOTH = frozenset({Backend.CPU, Backend.GPU})
STAGES = [PlainStage("read", ("path",), ("encoded",), CPU_ONLY),
          PlainStage("decode", ("encoded",), ("image",), BOTH)]
SLEEP_MS = 6.0          # planted sleep per image
BATCH_SLEEP_MS = 40.0   # planted sleep per batch


def measurements(batch: BatchCosts, *, cores=4, trainer=0.0, read=(100e-6, 0.0), decode=(900e-6, 0.0)):
    costs = (StageCost("read", read[0], None, 1e3, read[1]), StageCost("decode", decode[0], 20e-6, 4e3, decode[1]))
    return Measurements(costs, 1e3, Resources(cores, trainer, None), batch=batch)


def model(batch_size: int) -> PlacementModel:
    return PlacementModel(STAGES, None, batch_size=batch_size, output_device="cpu", max_threads=None,
                          gpu_memory_reserve_bytes=0.0)


@pytest.mark.parametrize("batch_size", [1, 16, 256])
@pytest.mark.parametrize("threads", [1, 3])
def test_per_batch_costs_are_divided_by_the_batch_size_on_their_resource(batch_size, threads):
    batch = BatchCosts(cpu_s=4e-3, thread_s=2e-3, delivery_s=0.5e-3, transfer_s=1e-3)
    p = model(batch_size).one(2, threads, measurements(batch, trainer=1.5)).prediction
    core_s = 100e-6 + 900e-6 + 4e-3 / batch_size          # stages and forming share the cores
    own_s = 2e-3 / batch_size                              # of which the batch thread's own, beside the pool's
    assert p.cpu_core_s_per_sample == pytest.approx(core_s)
    assert p.cpu_s_per_sample == pytest.approx(max((core_s - own_s) / min(threads, 4 - 1.5),
                                                   core_s / min(threads + 1, 4 - 1.5)))
    assert p.thread_s_per_sample == pytest.approx((2e-3 + 0.5e-3) / batch_size)  # one batch thread, not shared
    assert p.transfer_s_per_sample == 0.0                  # all on the CPU, delivered there: nothing crosses
    slowest = max(p.cpu_s_per_sample, p.thread_s_per_sample)
    assert p.samples_per_s == pytest.approx(1 / slowest)
    assert p.bottleneck == ("cpu" if slowest == p.cpu_s_per_sample else "thread")


def test_without_per_batch_costs_the_prediction_is_the_stages_alone():
    p = model(64).one(2, 2, measurements(BatchCosts())).prediction
    assert (p.thread_s_per_sample, p.samples_per_s) == (0.0, pytest.approx(2 / 1000e-6))


def test_the_batch_threads_own_work_runs_beside_one_worker_thread():
    # 1 ms of CPU a sample, 0.4 of it on the batch thread (an image pipeline's torch stages), 0.6 on the workers
    # (DALI's decoding): one worker keeps one core busy and the batch thread a second, so two cores serve even
    # one worker thread; more workers than cores gain nothing, however many there are.
    m = measurements(BatchCosts(thread_s=64 * 400e-6), cores=2)
    rates = {t: model(64).one(2, t, m).prediction.samples_per_s for t in (1, 2, 3)}
    assert rates == {1: pytest.approx(1 / 600e-6), 2: pytest.approx(2 / 1000e-6), 3: pytest.approx(2 / 1000e-6)}
    # with the batch thread idle (a table's workers do everything), the workers alone set the pace, as before
    idle = measurements(BatchCosts(), cores=2)
    assert model(64).one(2, 1, idle).prediction.samples_per_s == pytest.approx(1 / 1000e-6)
    # the batch thread's time measured at the all-CPU cut is never more than the work a cut leaves on the CPU
    gpu_cut = model(64).one(1, 1, m).prediction
    assert gpu_cut.cpu_s_per_sample == pytest.approx(100e-6 / 2)


def test_the_batch_thread_bounds_a_pipeline_whose_batches_are_slow_to_form():
    # 20 ms of the batch thread per batch of 16 (1.25 ms a sample) against 1 ms a sample over 3 cores
    p = model(16).one(2, 3, measurements(BatchCosts(thread_s=20e-3))).prediction
    assert p.bottleneck == "thread" and p.samples_per_s == pytest.approx(16 / 20e-3)


def test_a_blocking_stage_holds_the_batch_thread_but_no_core():
    # decode: 900 us of which 600 asleep; over 2 threads the cores see 400 us, the batch thread 600 us
    p = model(8).one(2, 2, measurements(BatchCosts(), decode=(900e-6, 600e-6))).prediction
    assert p.cpu_core_s_per_sample == pytest.approx(400e-6)
    assert p.cpu_s_per_sample == pytest.approx(200e-6)
    assert p.thread_s_per_sample == pytest.approx(600e-6)
    assert p.bottleneck == "thread" and p.samples_per_s == pytest.approx(1 / 600e-6)


def test_the_copies_fixed_cost_counts_only_where_something_crosses():
    stages_gpu = model(32)
    m = measurements(BatchCosts(transfer_s=3.2e-3))
    gpu_m = Measurements(m.costs, m.source_bytes_per_sample,
                         Resources(4, 0.0, None, h2d_bytes_per_s=1e9), batch=m.batch)
    at_decode = stages_gpu.one(1, 1, gpu_m).prediction  # (predicted, though no GPU lets it run here)
    # read's output (1 kB) goes to the GPU, decode's (4 kB) back to the host: the larger, plus the fixed cost
    assert at_decode.transfer_s_per_sample == pytest.approx(4e3 / 1e9 + 3.2e-3 / 32)
    on_cpu = stages_gpu.one(2, 1, gpu_m).prediction
    assert on_cpu.transfer_s_per_sample == 0.0


def test_batch_costs_are_what_the_batch_path_spent_beyond_its_stages():
    costs = (StageCost("read", 100e-6, None, 1e3, 40e-6), StageCost("decode", 900e-6, None, 4e3))
    # 4 batches of 16: 64 x 960 us of core time in the stages (read's blocking is no core time)
    path = BatchPath(batches=4, samples=64, process_cpu_s=64 * 960e-6 + 4 * 3e-3, thread_cpu_s=4 * 5e-3, tensors=3)
    got = batch_costs_of(costs, path, delivery_s=0.2e-3, transfer_s=0.1e-3)
    assert (got.cpu_s, got.thread_s, got.delivery_s, got.transfer_s) == (
        pytest.approx(3e-3), pytest.approx(5e-3), 0.2e-3, 0.1e-3)
    cheaper = BatchPath(batches=4, samples=64, process_cpu_s=0.5 * 64 * 960e-6, thread_cpu_s=0.0, tensors=3)
    assert batch_costs_of(costs, cheaper).cpu_s == 0.0  # noise below the stages' sum is no negative cost
    assert batch_costs_of(costs, BatchPath(0, 0, 0.0, 0.0, 0), delivery_s=1e-3) == BatchCosts(delivery_s=1e-3)


def test_bad_costs_are_named():
    with pytest.raises(ValueError, match="delivery_s must be"):
        BatchCosts(delivery_s=-1.0)
    with pytest.raises(ValueError, match=r"blocked_s_per_sample \(0.002\) is part of cpu_s_per_sample \(0.001\)"):
        StageCost("read", 1e-3, None, 0.0, 2e-3)
    with pytest.raises(TypeError, match="batch must be a BatchCosts, got dict"):
        Measurements((), 0.0, Resources(1, 0.0, None), batch={})


def test_the_stage_timer_counts_a_sleep_as_blocked_and_a_burn_as_not():
    timer = StageTimer()
    started = timer.start()
    time.sleep(0.05)
    started = timer.stop("sleeps", started)
    until = time.thread_time() + 0.03
    while time.thread_time() < until:
        pass
    timer.stop("burns", started)
    # seconds: CPU time (the scheduler's core seconds); blocked: held off the CPU, beside it
    assert timer.seconds["sleeps"] < 0.02 and timer.blocked["sleeps"] >= 0.045
    assert timer.seconds["burns"] >= 0.03 and timer.blocked["burns"] < 0.5 * timer.seconds["burns"]
    before = busy_time()
    time.sleep(0.02)
    assert busy_time() - before >= 0.019  # a sleep is busy time of its thread (no run-queue wait to take off)
    wall = StageTimer(time.perf_counter)
    wall.stop("x", wall.start())
    assert wall.blocked == {}  # stages timed end to end (a synchronised device) have no CPU time to tell apart


# ---- planted in a real pipeline ------------------------------------------------------------------------------
def sleep_per_image(images):
    time.sleep(SLEEP_MS / 1000 * len(images))
    return images


def sleep_per_batch(images):
    time.sleep(BATCH_SLEEP_MS / 1000)
    return images


def planted(image_dir, fn, name):
    return image.pipeline(image_dir, [image.decode(), image.resize((32, 32)), image.custom(fn, name=name),
                                      image.normalize()])


def test_a_stage_that_sleeps_is_measured_by_the_time_it_holds_its_thread(image_dir):
    with Loader(planted(image_dir, sleep_per_image, "sleeps"), 8, placement="cpu", num_threads=2) as loader:
        profile = profile_loader(loader, batches=3)
    rows = {s["stage"]: s for s in profile.stages}
    assert abs(rows["sleeps"]["ms_per_sample"] - SLEEP_MS) <= 0.15 * SLEEP_MS, rows["sleeps"]
    assert profile.bottleneck["stage"] == "sleeps" and profile.bottleneck["resource"] == "thread"
    # the batch thread holds the sleep whatever the thread count: no more than 1 / 6 ms predicted
    current = next(p for p in profile.placements if p["current"])
    assert current["bound_by"] == "thread" and current["predicted_samples_per_s"] <= 1000 / SLEEP_MS


def test_a_sleep_per_batch_is_in_the_prediction(image_dir):
    batch = 8
    with Loader(planted(image_dir, sleep_per_batch, "per_batch"), batch, placement="cpu") as loader:
        profile = profile_loader(loader, batches=3)
    rows = {s["stage"]: s for s in profile.stages}
    per_sample = BATCH_SLEEP_MS / batch
    assert abs(rows["per_batch"]["ms_per_sample"] - per_sample) <= 0.15 * per_sample, rows["per_batch"]
    assert profile.measured["predicted_samples_per_s"] <= 1000 * batch / BATCH_SLEEP_MS


def test_an_injected_hand_off_cost_is_in_the_prediction(image_dir, monkeypatch):
    """The hand-off to the trainer's thread is per batch, on the batch thread: 0.5 s of it bounds a batch of 8 to
    16 samples/s whatever the stages cost."""
    monkeypatch.setattr(profile_module, "measure_handoff", lambda: 0.5)
    with Loader(image.val(image_dir, size=32), 8, placement="cpu", num_threads=2) as loader:
        profile = profile_loader(loader, batches=2)
    assert profile.batch_costs["hand_off_ms"] == 500.0
    thread_ms = profile.batch_costs["batch_thread_ms"]  # its own CPU time, beside the hand-off
    assert profile.measured["predicted_samples_per_s"] == pytest.approx(8 / (0.5 + thread_ms / 1000), rel=0.02)
    assert "the hand-off 500 ms" in profile.table()
    assert profile.bottleneck["resource"] == "thread"
    assert next(p for p in profile.placements if p["current"])["bound_by"] == "thread"


def test_a_stage_timed_a_hair_below_zero_costs_nothing_instead_of_failing(image_dir):
    """Clocks read in pieces (a folded stage's share taken off another's, busy time beside thread time) can give
    a stage -2.5e-6 s; the profile clamps it to 0 where it used to raise from StageCost's check."""
    import numpy as np
    import torch

    from feedline.loader.placement import profiler
    from feedline.loader.runners.contract import RunnerConfig, StageTimes
    from feedline.loader.sampler import EpochSampler

    spec = image.val(image_dir, size=32)
    names = [s.name for s in spec.stages]

    class Fake:
        def profile(self, plans):
            seconds = {name: 1e-3 for name in names}
            seconds[names[1]] = -2.49e-06
            return StageTimes(sum(p.indices.size for p in plans), seconds, {}, 100.0,
                              blocked={names[0]: -1e-7})

        def batches(self, plans):
            for plan in plans:
                yield {"index": torch.from_numpy(np.asarray(plan.indices))}, None

        def close(self):
            pass

    config = RunnerConfig(cut=spec.all_cpu, device=torch.device("cpu"), batch_size=4)
    made = profiler.profile(spec, config, lambda c: Fake(), lambda b, s: EpochSampler(40, b, shuffle=False, seed=s),
                            gpu=False)
    costs = {c.stage: c for c in made.costs}
    assert costs[names[1]].cpu_s_per_sample == 0.0 and costs[names[0]].blocked_s_per_sample == 0.0
    assert costs[names[2]].cpu_s_per_sample == pytest.approx(1e-3 / 4)


class _Order:
    """An order of ``buffer_rows`` per shuffle buffer-full (None: no buffer, as an image order), batch b of
    its first epoch holding the indices [b * batch_size, (b + 1) * batch_size)."""

    def __init__(self, batch_size: int, buffer_rows, batches: int = 100):
        self.batch_size, self.buffer_rows, self.batches = batch_size, buffer_rows, batches

    def __len__(self):
        return self.batches

    def epoch(self, epoch):
        import numpy as np
        from feedline.loader.sampler import BatchPlan
        for b in range(self.batches):
            yield BatchPlan(np.arange(b * self.batch_size, (b + 1) * self.batch_size), np.ones(self.batch_size, bool),
                            batch=b)


class _Runner:
    """Records which plans it profiled one by one and which its batch path made."""

    def __init__(self, log):
        self.log = log

    def profile(self, plans):
        from feedline.loader.runners.contract import StageTimes
        self.log["profiled"] += [p.batch for p in plans]
        return StageTimes(sum(p.indices.size for p in plans), {"read": 0.0, "decode": 0.0}, {}, 0.0)

    def batches(self, plans):
        for plan in plans:
            self.log["path"].append(plan.batch)
            yield {"index": plan.indices}, None

    def close(self):
        pass


@pytest.mark.parametrize("buffer_rows,path", [(None, list(range(6, 12))), (4 * 16, list(range(8, 16))),
                                              (3 * 16 + 1, list(range(8, 16))), (2 * 16, list(range(6, 10)))])
def test_a_streamed_tables_batch_path_goes_over_whole_buffer_fulls(buffer_rows, path):
    # 16 rows a batch, 5 batches profiled after one warm-up: an image order's batch path is the 6 plans after them
    # (the first made before its clock starts);
    # a table's, two whole buffer-fulls from the first buffer opened after the profiled plans (each buffer-full's
    # chunks are read as it opens, for all its batches: a stretch cut inside one counts an opening or none)
    from feedline.loader.placement import profiler
    from feedline.loader.runners.contract import RunnerConfig
    spec = SimpleNamespace(stages=STAGES, all_cpu=2)
    log = {"profiled": [], "path": []}
    profiler.profile(spec, RunnerConfig(2, torch.device("cpu"), 16), lambda config: _Runner(log),
                     lambda batch_size, seed: _Order(batch_size, buffer_rows), gpu=False, batches=5)
    assert log["profiled"] == list(range(6)) and log["path"] == path
    assert profiler.buffer_batches(lambda b, s: _Order(b, buffer_rows), 16) == (
        1 if buffer_rows is None else -(-buffer_rows // 16))


def test_a_buffer_larger_than_the_table_counts_the_tables_batches(tmp_path):
    """A table smaller than its shuffle buffer is one buffer-full: its batch path goes over two epochs, not over
    two buffers' worth of batches of the file read again and again (512 a buffer-full at batch 128)."""
    from feedline.datagen.synthetic_criteo import make_criteo
    from feedline.loader import Loader
    from feedline.loader.placement import profiler
    from feedline.loader.profile import _orders
    from feedline.pipelines.criteo import criteo

    assert profiler.buffer_batches(lambda b, s: _Order(b, 65_536, batches=24), 128) == 24
    assert profiler.buffer_batches(lambda b, s: _Order(b, 1_000, batches=24), 128) == 8
    make_criteo(tmp_path / "day.tsv", 3_000, seed=0)
    loader = Loader(criteo(tmp_path / "day.tsv"), batch_size=128, placement="cpu")
    try:
        assert loader.shuffle_buffer > 3_000
        assert profiler.buffer_batches(_orders(loader), 128) == len(loader) == 24
    finally:
        loader.close()
