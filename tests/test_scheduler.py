"""The scheduler's decisions under synthetic measurements, its online re-planning under noise and change,
and the plan report."""
import dataclasses
import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedline.loader.errors import PlacementError
from feedline.loader.placement.decision import PlacementDecision, trainer_load
from feedline.loader.placement.measurements import MIN_CPU_SHARE, MIN_WAIT_BATCHES, Measurements, Resources, StageCost
from feedline.loader.placement.model import DEMAND_HEADROOM, GPU_SATURATED, prefetch_depth
from feedline.loader.placement.monitors import GpuReading, WaitReading
from feedline.loader.placement.report import decision_dict, decision_table
from feedline.loader.placement.scheduler import STABLE_WINDOW_CONFIRMS, Scheduler
from feedline.pipelines.spec import PipelineSpec
from feedline.pipelines.stage import Backend, PlainStage

GiB = 2 ** 30
BOTH = frozenset({Backend.CPU, Backend.GPU})
CPU_ONLY = frozenset({Backend.CPU})
BATCH = 256

# Image stages as the first image-train recipe had them, with costs of a CPU-bound JPEG pipeline:
# decoding takes 8 ms of a core per image, 0.15 ms of an idle GPU.
IMAGE_STAGES = [
    PlainStage("crop_window", ("encoded",), ("window", "flip"), CPU_ONLY),
    PlainStage("decode", ("encoded", "window"), ("decoded",), BOTH),
    PlainStage("resize", ("decoded",), ("resized",), BOTH),
    PlainStage("normalize", ("resized", "flip"), ("image",), BOTH),
]
IMAGE_COSTS = (
    StageCost("crop_window", 20e-6, None, 32),
    StageCost("decode", 8e-3, 0.15e-3, 560e3),
    StageCost("resize", 1.5e-3, 0.05e-3, 150e3),
    StageCost("normalize", 0.6e-3, 0.02e-3, 602e3),
)
JPEG_BYTES = 110e3
CPU_CUT = 4
EARLIEST_GPU_CUT = 1


def image_measurements(*, gpu=True, busy=0.2, free=60 * GiB, cores=8, trainer_cores=1.0, wait=None,
                       needed=None, held=0.0):
    reading = GpuReading(busy, int(free), 80 * GiB) if gpu else None
    resources = Resources(cores, trainer_cores, reading, busy if gpu else 0.0,
                          gpu_memory_needed_per_batch=needed, gpu_memory_held_bytes=held)
    return Measurements(IMAGE_COSTS, JPEG_BYTES, resources, wait=wait)


def image_scheduler(clock=None, **kwargs):
    kwargs.setdefault("output_device", "gpu")
    kwargs.setdefault("min_interval_s", 60.0)
    kwargs.setdefault("confirm", 5)
    return Scheduler(IMAGE_STAGES, batch_size=BATCH, clock=clock or Clock(), **kwargs)


class Clock:
    """Advances 10 s per update, the interval the tests feed measurements at."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def noisy(m: Measurements, rng: random.Random, rel: float = 0.15) -> Measurements:
    """Every reading times an independent factor in [1 - rel, 1 + rel]."""
    def f(x):
        return None if x is None else x * rng.uniform(1 - rel, 1 + rel)

    r = m.resources
    gpu = r.gpu and GpuReading(min(1.0, f(r.gpu.utilization)),
                               min(r.gpu.memory_total_bytes, int(f(r.gpu.memory_free_bytes))),
                               r.gpu.memory_total_bytes)
    resources = dataclasses.replace(r, trainer_cpu_cores_busy=f(r.trainer_cpu_cores_busy), gpu=gpu,
                                    trainer_gpu_busy_fraction=min(1.0, f(r.trainer_gpu_busy_fraction)),
                                    h2d_bytes_per_s=f(r.h2d_bytes_per_s))
    costs = tuple(dataclasses.replace(c, cpu_s_per_sample=f(c.cpu_s_per_sample),
                                      gpu_s_per_sample=f(c.gpu_s_per_sample),
                                      bytes_out_per_sample=f(c.bytes_out_per_sample)) for c in m.costs)
    wait = m.wait and WaitReading(f(m.wait.mean_wait_s), f(m.wait.mean_step_s), m.wait.batches,
                                  f(m.wait.stdev_wait_s))
    return dataclasses.replace(m, costs=costs, source_bytes_per_sample=f(m.source_bytes_per_sample),
                               resources=resources, wait=wait, samples_per_s=f(m.samples_per_s))


def run(scheduler, clock, measurements_at, updates):
    """Feed ``measurements_at(i)`` for i in range(updates), 10 s apart; the update indices that moved."""
    moves = []
    for i in range(updates):
        clock.now += 10.0
        if scheduler.update(measurements_at(i)) is not None and i > 0:
            moves.append(i)
    return moves


# ---- single decisions ----------------------------------------------------------------------------------

def test_without_a_gpu_everything_runs_on_the_cpu_on_the_free_cores():
    s = image_scheduler()
    plan = s.decide(image_measurements(gpu=False, cores=8, trainer_cores=1.0))
    assert (plan.cut, plan.placement, plan.threads, plan.prefetch) == (CPU_CUT, "cpu", 7, 2)
    assert plan.prediction.bottleneck == "cpu"
    assert plan.samples_per_s == pytest.approx(7 / sum(c.cpu_s_per_sample for c in IMAGE_COSTS))
    assert [p.backend for p in plan.stages] == [Backend.CPU] * 4
    assert [p.reason for p in plan.stages][1:] == ["CPU: no GPU on this machine"] * 3
    assert plan.stages[0].reason == "CPU: runs only on the CPU"


def test_fewer_threads_when_the_trainer_uses_cores():
    s = image_scheduler()
    threads = {busy: s.decide(image_measurements(gpu=False, cores=8, trainer_cores=busy)).threads
               for busy in (0.0, 1.0, 2.5, 6.0, 8.0)}
    assert threads == {0.0: 8, 1.0: 7, 2.5: 6, 6.0: 2, 8.0: 1}


def test_threads_stop_where_the_trainer_is_served():
    # The trainer takes a batch every 0.8533 s: 300 samples/s; one thread makes 98.8, so 4 threads
    # cover 300 x DEMAND_HEADROOM (375) and more would only take cores from the trainer.
    wait = WaitReading(mean_wait_s=0.0, mean_step_s=BATCH / 300, batches=64)
    plan = image_scheduler().decide(image_measurements(gpu=False, wait=wait))
    assert (plan.cut, plan.threads) == (CPU_CUT, 4)
    # With an idle GPU too, the CPU still keeps up, so the GPU is left to the trainer.
    plan = image_scheduler().decide(image_measurements(gpu=True, busy=0.2, wait=wait))
    assert (plan.cut, plan.threads) == (CPU_CUT, 4)
    assert "keeps up with the trainer" in plan.stages[1].reason


def test_idle_gpu_takes_decode_and_augmentation_from_a_cpu_bound_pipeline():
    class Encoded:
        produces = ("encoded",)

    spec = PipelineSpec("image", Encoded(), tuple(IMAGE_STAGES), ("image",))
    s = Scheduler(spec, batch_size=BATCH, output_device=Backend.GPU)
    plan = s.decide(image_measurements(busy=0.2))
    assert plan.cut == EARLIEST_GPU_CUT == min(spec.valid_cuts())
    assert plan.placement == spec.describe_cut(plan.cut) == "gpu"
    assert {p.stage: p.backend for p in plan.stages} == spec.backends_at(plan.cut)
    decode = plan.stages[1]
    assert decode.reason == "GPU: 38 ms/batch vs CPU 2,048 ms/batch; GPU 20% busy"
    gpu_s = sum(c.gpu_s_per_sample for c in IMAGE_COSTS[1:]) / (1 - 0.2)
    assert plan.prediction.gpu_s_per_sample == pytest.approx(gpu_s)
    assert plan.prediction.bottleneck == "gpu"
    assert plan.samples_per_s == pytest.approx(1 / gpu_s)
    assert plan.threads == 1   # the CPU part (crop windows) is far from the bottleneck


def test_busy_gpu_time_is_what_the_trainer_leaves():
    s = image_scheduler()
    idle = s.decide(image_measurements(busy=0.0)).prediction.gpu_s_per_sample
    half = s.decide(image_measurements(busy=0.5)).prediction.gpu_s_per_sample
    assert half == pytest.approx(2 * idle)


@pytest.mark.parametrize("busy", [GPU_SATURATED, 0.97, 1.0])
def test_saturated_gpu_keeps_everything_on_the_cpu(busy):
    plan = image_scheduler().decide(image_measurements(busy=busy))
    assert (plan.cut, plan.threads) == (CPU_CUT, 7)
    assert plan.stages[1].reason == f"CPU: GPU {busy:.0%} busy with training"
    assert "no GPU placement can run" in plan.reason


def test_too_little_free_gpu_memory_keeps_everything_on_the_cpu():
    plan = image_scheduler().decide(image_measurements(free=512 * 2 ** 20))
    assert plan.cut == CPU_CUT
    assert "GPU memory" in plan.stages[1].reason and "512.0 MiB free" in plan.stages[1].reason


def test_memory_the_pipeline_already_holds_counts_as_available():
    # Measured needs per batch; x (prefetch 2 + 1) + the 512 MiB reserve.
    needed = {1: 400e6, 2: 300e6, 3: 100e6}
    reserve = 512 * 2 ** 20
    free = 3 * 300e6 + reserve + 1e6
    plan = image_scheduler().decide(image_measurements(free=free, needed=needed))
    assert plan.cut == 2 and plan.prediction.gpu_memory_bytes == pytest.approx(3 * 300e6 + reserve)
    plan = image_scheduler().decide(image_measurements(free=free, needed=needed, held=400e6))
    assert plan.cut == EARLIEST_GPU_CUT


def test_transfer_counts_the_bytes_crossing_the_cut_and_the_delivery():
    slow = 1e6   # bytes/s: makes every plan transfer-bound
    m = image_measurements(busy=0.0)
    m = dataclasses.replace(m, resources=dataclasses.replace(m.resources, h2d_bytes_per_s=slow))
    to_gpu = image_scheduler(output_device="gpu")
    to_cpu = image_scheduler(output_device="cpu")
    candidates = {(s.output_device, cut): s.adopt(cut, 1, m).prediction.transfer_s_per_sample
                  for s in (to_gpu, to_cpu) for cut in s.valid_cuts}
    image_out = IMAGE_COSTS[3].bytes_out_per_sample
    # Cut 1: the JPEG and the crop window go up; to the GPU nothing else moves, to the CPU the image comes back.
    assert candidates[Backend.GPU, 1] == pytest.approx((JPEG_BYTES + 32) / slow)
    assert candidates[Backend.CPU, 1] == pytest.approx(max(JPEG_BYTES + 32, image_out) / slow)
    # Cut 3: the resized image and the flip go up.
    assert candidates[Backend.GPU, 3] == pytest.approx((150e3 + 32) / slow)
    # All on the CPU: the image goes up only if the trainer is on the GPU.
    assert candidates[Backend.GPU, CPU_CUT] == pytest.approx(image_out / slow)
    assert candidates[Backend.CPU, CPU_CUT] == 0.0
    assert to_gpu.decide(m).prediction.bottleneck == "transfer"


def test_prefetch_depth_rule():
    steady = WaitReading(0.0, 0.1, 64, stdev_wait_s=0.0)
    jittery = WaitReading(0.01, 0.1, 64, stdev_wait_s=0.02)
    noisy_waits = WaitReading(0.02, 0.1, 64, stdev_wait_s=0.05)
    demand = 1000.0
    assert prefetch_depth(2000.0, None, None) == 2
    assert prefetch_depth(2000.0, demand, steady) == 2
    assert prefetch_depth(2000.0, demand, jittery) == 3
    assert prefetch_depth(2000.0, demand, noisy_waits) == 4
    assert prefetch_depth(500.0, demand, noisy_waits) == 2   # slower than the trainer: the queue stays empty


def test_plan_prefetch_follows_the_trainers_waits():
    wait = WaitReading(mean_wait_s=0.02, mean_step_s=1.0, batches=64, stdev_wait_s=0.5)
    plan = image_scheduler().decide(image_measurements(busy=0.2, wait=wait))
    assert plan.prefetch == 4


def test_trainer_load_removes_the_pipelines_own_load():
    plan = image_scheduler().decide(image_measurements(busy=0.0))
    sps = 1000.0
    cores, gpu_busy = trainer_load(3.0, GpuReading(0.5, GiB, 2 * GiB), plan, sps)
    assert cores == pytest.approx(3.0 - plan.prediction.cpu_core_s_per_sample * sps)
    assert gpu_busy == pytest.approx(0.5 - plan.prediction.gpu_busy_s_per_sample * sps)
    assert trainer_load(0.0, None, plan, sps) == (0.0, 0.0)


def test_no_placement_possible_is_an_error():
    stages = [PlainStage("gpu_only", ("raw",), ("out",), frozenset({Backend.GPU}))]
    s = Scheduler(stages, batch_size=8)
    m = Measurements((StageCost("gpu_only", None, 1e-4, 10),), 10, Resources(4, 0.0, None))
    with pytest.raises(PlacementError, match="no GPU on this machine"):
        s.decide(m)


def test_costs_must_name_every_stage_once():
    s = image_scheduler()
    m = image_measurements()
    with pytest.raises(ValueError, match=r"missing \['normalize'\]"):
        s.decide(dataclasses.replace(m, costs=m.costs[:3]))
    with pytest.raises(ValueError, match=r"unknown \['blur'\]"):
        s.decide(dataclasses.replace(m, costs=m.costs + (StageCost("blur", 1e-3, 1e-4, 1),)))


@pytest.mark.parametrize("kwargs, error, word", [
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"deadband": 0.05}, ValueError, "deadband"),
    ({"confirm": 0}, ValueError, "confirm"),
    ({"min_interval_s": -1}, ValueError, "min_interval_s"),
    ({"recent_intervals": -1}, ValueError, "recent_intervals"),
    ({"max_threads": 0}, ValueError, "max_threads"),
    ({"output_device": "tpu"}, ValueError, "output_device"),
    ({"clock": 5}, TypeError, "clock"),
    ({"valid_cuts": [7]}, ValueError, "valid_cuts"),
])
def test_scheduler_arguments_are_checked(kwargs, error, word):
    args = {"batch_size": BATCH, **kwargs}
    with pytest.raises(error, match=word):
        Scheduler(IMAGE_STAGES, **args)


def test_inputs_are_checked():
    with pytest.raises(TypeError, match="pipeline"):
        Scheduler("image-train", batch_size=8)
    with pytest.raises(ValueError, match="cpu_s_per_sample"):
        StageCost("decode", -1.0, None, 0)
    with pytest.raises(ValueError, match="trainer_gpu_busy_fraction"):
        Resources(4, 0.0, None, 1.5)
    with pytest.raises(ValueError, match="cores"):
        Resources(0, 0.0, None)
    with pytest.raises(ValueError, match="h2d_bytes_per_s"):
        Resources(4, 0.0, None, h2d_bytes_per_s=0.0)
    with pytest.raises(TypeError, match="resources"):
        Measurements(IMAGE_COSTS, 1.0, None)


# ---- the model, recomputed from the scheduler's module docstring ----------------------------------------

GPU_MEMORY_RESERVE = 512 * 2 ** 20   # Scheduler's default gpu_memory_reserve_bytes
TIE = 1e-9                           # relative difference under which two throughputs are a tie


def producers_of(stages):
    """For every stage, the index of the stage that made each name it consumes (-1: the source)."""
    made_by, consumed = {}, []
    for j, stage in enumerate(stages):
        consumed.append({made_by.get(name, -1) for name in stage.consumes})
        made_by.update({name: j for name in stage.produces})
    outputs = {made_by[name] for name in stages[-1].produces}
    return consumed, outputs


def brute_force(stages, m, *, batch_size, output_device, reserve=GPU_MEMORY_RESERVE):
    """Every (cut, threads) the model can judge, with (samples/s, score, prefetch, why it cannot run or None).

    Written from the docstring of loader/placement/model.py (and those of Resources, StageCost,
    Measurements.demand_samples_per_s and prefetch_depth), not from the scheduler's code."""
    n = len(stages)
    costs = {c.stage: c for c in m.costs}
    cpu_cost = [costs[s.name].cpu_s_per_sample for s in stages]
    gpu_cost = [costs[s.name].gpu_s_per_sample for s in stages]
    out_bytes = [costs[s.name].bytes_out_per_sample for s in stages]
    consumed, outputs = producers_of(stages)
    res, wait = m.resources, m.wait

    def nbytes(producers):
        return sum(m.source_bytes_per_sample if p == -1 else out_bytes[p] for p in producers)

    # The trainer's demand counts once it was measured over enough batches.
    demand = batch_size / wait.mean_step_s \
        if wait is not None and wait.batches >= MIN_WAIT_BATCHES and wait.mean_step_s > 0 else None
    free_cores = max(res.cores - res.trainer_cpu_cores_busy, MIN_CPU_SHARE)
    d2h = res.d2h_bytes_per_s or res.h2d_bytes_per_s
    found = {}
    for cut in range(n + 1):
        if not (all(Backend.CPU in s.backends for s in stages[:cut])
                and all(Backend.GPU in s.backends for s in stages[cut:])):
            continue   # not a valid cut
        if any(cpu_cost[i] is None for i in range(cut)) or any(gpu_cost[i] is None for i in range(cut, n)):
            continue   # a stage has no cost on the backend this cut gives it: nothing to predict
        crossing = {p for j in range(cut, n) for p in consumed[j] if p < cut}
        back = set()
        # Batches wanted on the GPU cannot be delivered there without one: the docstring does not say so, the
        # scheduler then counts no delivery transfer (an all-CPU plan without a GPU moves nothing).
        if output_device == "gpu" and res.gpu is not None:
            crossing |= {p for p in outputs if p < cut}
        elif output_device == "cpu":
            back = {p for p in outputs if p >= cut}
        gpu_stages = range(cut, n)
        blocked = None
        if cut < n and res.gpu is None:
            blocked = "no GPU"
        elif cut < n and res.trainer_gpu_busy_fraction >= GPU_SATURATED:
            blocked = "GPU saturated"
        for threads in range(1, res.cores + 1):
            if blocked:
                found[cut, threads] = (None, None, None, blocked)
                continue
            cpu = sum(cpu_cost[:cut]) / min(threads, free_cores)
            gpu = sum(gpu_cost[cut:]) / (1 - res.trainer_gpu_busy_fraction) if cut < n else 0.0
            transfer = max(nbytes(crossing) / res.h2d_bytes_per_s, nbytes(back) / d2h)
            samples_per_s = 1 / max(cpu, gpu, transfer)
            # prefetch_depth's rule: 2, or 3 / 4 when the pipeline outpaces a trainer whose waits jitter
            prefetch = 2
            if demand is not None and samples_per_s >= demand:
                jitter = wait.stdev_wait_s / wait.mean_step_s
                prefetch = 2 if jitter < 0.1 else 3 if jitter < 0.3 else 4
            why_not = None
            if cut < n:
                measured = (res.gpu_memory_needed_per_batch or {}).get(cut)
                # Resources: cuts without a measured need are estimated from the stages' bytes: what crosses
                # to the GPU and what every GPU stage makes, per sample, times the batch.
                per_batch = measured if measured is not None else \
                    batch_size * (nbytes({p for j in gpu_stages for p in consumed[j] if p < cut})
                                  + sum(out_bytes[i] for i in gpu_stages))
                if per_batch * (prefetch + 1) + reserve > res.gpu.memory_free_bytes + res.gpu_memory_held_bytes:
                    why_not = "GPU memory"
            score = min(samples_per_s, DEMAND_HEADROOM * demand) if demand is not None else samples_per_s
            found[cut, threads] = (samples_per_s, score, prefetch, why_not)
    return found


def choose(found):
    """The best (cut, threads) that can run: highest score; ties to the later cut, then fewer threads."""
    feasible = {k: v for k, v in found.items() if v[3] is None}
    best = max(v[1] for v in feasible.values())
    tied = [k for k, v in feasible.items() if v[1] >= best * (1 - TIE)]
    return best, max(tied, key=lambda k: (k[0], -k[1]))


def log_uniform(low, high):
    return st.floats(math.log10(low), math.log10(high)).map(lambda e: 10.0 ** e)


@st.composite
def random_measurements(draw):
    """Costs, bytes and resources over ranges where every cut, bottleneck, memory limit and demand cap occurs."""
    def maybe(strategy, none_one_in):
        """``strategy``'s value, or None about one time in ``none_one_in``."""
        return None if draw(st.sampled_from([True] + [False] * (none_one_in - 1))) else draw(strategy)

    costs = []
    for stage in IMAGE_STAGES:
        cpu = draw(log_uniform(1e-6, 2e-2))
        on_gpu = log_uniform(1e-3, 3).map(lambda f, cpu=cpu: cpu * f)   # up to 1000 times faster, or 3 slower
        gpu = maybe(on_gpu, 10) if Backend.GPU in stage.backends else None
        costs.append(StageCost(stage.name, cpu, gpu, draw(st.one_of(st.just(0.0), log_uniform(10, 1e6)))))
    cores = draw(st.integers(1, 16))
    has_gpu = draw(st.sampled_from([True, True, True, False]))
    busy = draw(st.one_of(st.floats(0, 0.9), st.sampled_from([0.0, 0.94, GPU_SATURATED, 0.97, 1.0])))
    reading = GpuReading(busy, int(draw(st.floats(0, 8)) * GiB), 80 * GiB) if has_gpu else None
    needed = draw(st.one_of(st.none(), st.dictionaries(st.integers(1, 3), st.floats(0, 2e9), max_size=3)))
    resources = Resources(cores, draw(st.floats(0, cores + 2)), reading, busy if has_gpu else 0.0,
                          h2d_bytes_per_s=draw(log_uniform(1e7, 3e10)),
                          d2h_bytes_per_s=maybe(log_uniform(1e7, 3e10), 4),
                          gpu_memory_needed_per_batch=needed,
                          gpu_memory_held_bytes=draw(st.sampled_from([0.0, 0.5 * GiB, 4 * GiB])))
    # The trainer's step spans demands of 10 to 100,000 samples/s of BATCH; it counts from MIN_WAIT_BATCHES.
    wait = maybe(st.builds(WaitReading, mean_wait_s=st.floats(0, 0.5),
                           mean_step_s=st.one_of(st.just(0.0), log_uniform(BATCH / 1e5, BATCH / 10)),
                           batches=st.sampled_from([0, 1, MIN_WAIT_BATCHES - 1, MIN_WAIT_BATCHES, 64]),
                           stdev_wait_s=st.floats(0, 1)), 3)
    return Measurements(tuple(costs), draw(log_uniform(10, 1e6)), resources, wait=wait)


@settings(max_examples=300, deadline=None)
@given(m=random_measurements(), output_device=st.sampled_from(["cpu", "gpu"]))
def test_decisions_are_the_best_plan_that_can_run(m, output_device):
    s = image_scheduler(output_device=output_device)
    found = brute_force(IMAGE_STAGES, m, batch_size=BATCH, output_device=output_device)
    best, (cut, threads) = choose(found)
    plan = s.decide(m)
    assert plan == s.decide(m)
    assert plan.feasible and found[plan.key][3] is None, found[plan.key]
    samples_per_s, score, prefetch, _ = found[plan.key]
    assert score == pytest.approx(best, rel=1e-9, abs=0)
    assert plan.samples_per_s == pytest.approx(samples_per_s, rel=1e-9, abs=0)
    assert (plan.cut, plan.threads, plan.prefetch) == (cut, threads, prefetch)
    if m.resources.gpu is None or m.resources.trainer_gpu_busy_fraction >= GPU_SATURATED:
        assert plan.cut == CPU_CUT


# ---- online re-planning --------------------------------------------------------------------------------

def test_first_update_adopts_the_decision():
    clock = Clock()
    s = image_scheduler(clock)
    m = image_measurements(busy=0.2)
    plan = s.update(m)
    assert plan == s.decide(m) == s.current
    assert [(h.time, h.old, h.new) for h in s.history] == [(0.0, None, plan)]


@pytest.mark.parametrize("busy", [0.2, 0.97])
def test_noisy_readings_of_steady_conditions_never_move(busy):
    clock = Clock()
    s = image_scheduler(clock)
    rng = random.Random(1234)
    base = image_measurements(busy=busy, wait=WaitReading(0.05, 0.4, 64, 0.01))
    assert run(s, clock, lambda i: noisy(base, rng), 1000) == []


# A two-stage feature pipeline that may run all on the GPU (cut 0) or all on the CPU (cut 2).
FEATURE_STAGES = [PlainStage("parse", ("raw",), ("fields",), BOTH), PlainStage("hash", ("fields",), ("ids",), BOTH)]


def feature_measurements(gpu_gain):
    """All-CPU makes 1 / (1.2 ms / 4 threads) = 3,333 samples/s; all-GPU ``1 + gpu_gain`` times that."""
    gpu_s = 0.3e-3 / (1 + gpu_gain)
    costs = (StageCost("parse", 0.8e-3, gpu_s * 2 / 3, 400), StageCost("hash", 0.4e-3, gpu_s / 3, 200))
    return Measurements(costs, 1000, Resources(4, 0.0, GpuReading(0.0, 60 * GiB, 80 * GiB), 0.0))


@pytest.mark.parametrize("seed", range(3))
def test_noisy_gain_inside_the_deadband_never_moves(seed):
    clock = Clock()
    s = Scheduler(FEATURE_STAGES, [0, 2], batch_size=BATCH, output_device="gpu", min_interval_s=30, clock=clock)
    base = feature_measurements(gpu_gain=0.05)
    s.adopt(2, 4, base)
    rng = random.Random(seed)
    assert run(s, clock, lambda i: noisy(base, rng), 1000) == []


def test_noisy_gain_well_beyond_the_noise_moves_once():
    clock = Clock()
    s = Scheduler(FEATURE_STAGES, [0, 2], batch_size=BATCH, output_device="gpu", min_interval_s=30, clock=clock)
    base = feature_measurements(gpu_gain=0.6)
    s.adopt(2, 4, base)
    rng = random.Random(7)
    moves = run(s, clock, lambda i: noisy(base, rng), 500)
    assert len(moves) == 1 and moves[0] < 50
    assert s.current.cut == 0
    assert s.history[-1].reason.startswith("mean predicted gain +")


def test_gpu_saturated_by_training_mid_run_moves_once_after_confirm_updates():
    clock = Clock()
    s = image_scheduler(clock, confirm=5)
    change = 100
    moves = run(s, clock, lambda i: image_measurements(busy=0.2 if i < change else 0.97), 400)
    assert moves == [change + s.confirm - 1]
    move = s.history[-1]
    assert (move.old.cut, move.new.cut) == (EARLIEST_GPU_CUT, CPU_CUT)
    assert move.time == clock.now - 10.0 * (400 - 1 - moves[0])
    assert move.reason.startswith("the current plan cannot run")


@pytest.mark.parametrize("seed", range(3))
def test_gpu_saturated_mid_run_under_noise_moves_once_within_four_confirms(seed):
    clock = Clock()
    s = image_scheduler(clock, confirm=5)
    rng = random.Random(seed)
    change = 100
    moves = run(s, clock, lambda i: noisy(image_measurements(busy=0.2 if i < change else 0.97), rng), 400)
    assert len(moves) == 1
    assert change <= moves[0] < change + STABLE_WINDOW_CONFIRMS * s.confirm
    assert s.current.cut == CPU_CUT


def test_gpu_freed_again_returns_after_the_stability_window():
    clock = Clock()
    s = image_scheduler(clock, confirm=5)
    busy = lambda i: 0.97 if 100 <= i < 200 else 0.2  # noqa: E731
    moves = run(s, clock, lambda i: image_measurements(busy=busy(i)), 300)
    window = STABLE_WINDOW_CONFIRMS * s.confirm
    assert moves == [104, 200 + window - 1]
    assert [h.new.cut for h in s.history] == [EARLIEST_GPU_CUT, CPU_CUT, EARLIEST_GPU_CUT]


def test_conditions_flapping_faster_than_confirm_never_move():
    clock = Clock()
    s = image_scheduler(clock, confirm=5)
    assert run(s, clock, lambda i: image_measurements(busy=0.97 if (i // 3) % 2 else 0.2), 600) == []


def test_min_interval_holds_a_move_back():
    clock = Clock()
    s = image_scheduler(clock, confirm=2, min_interval_s=200.0)
    moves = run(s, clock, lambda i: image_measurements(busy=0.97 if i >= 3 else 0.2), 50)
    # The first update (time 10) adopted a plan; the move waits until time 210.
    assert moves == [20]
    assert s.history[-1].time - s.history[0].time == 200.0


def test_a_plan_left_recently_is_not_retaken_for_a_change_inside_the_deadband():
    needed = {1: 300e6, 2: 250e6, 3: 100e6}   # GPU bytes per batch; x 3 + 512 MiB reserve
    need_cut1 = 3 * 300e6 + 512 * 2 ** 20

    def free_at(i):   # free memory dips 2% under cut 1's need for 10 updates, then sits 2% over it
        return 60 * GiB if i < 50 else need_cut1 * (0.98 if i < 60 else 1.02)

    def moves_with(recent_intervals):
        clock = Clock()
        s = image_scheduler(clock, confirm=5, min_interval_s=60.0, recent_intervals=recent_intervals)
        moves = run(s, clock, lambda i: image_measurements(free=free_at(i), needed=needed), 160)
        assert [h.new.cut for h in s.history] == [EARLIEST_GPU_CUT, 2, EARLIEST_GPU_CUT]
        return moves, s.history[2].time - s.history[1].time

    # Without the rule, cut 1 is retaken once it has run for the stability window.
    assert moves_with(0) == ([54, 60 + STABLE_WINDOW_CONFIRMS * 5 - 1], 250.0)
    # With it, 4% more memory is no change of conditions: cut 1 stays barred for 10 x 60 s after leaving it.
    assert moves_with(10) == ([54, 114], 600.0)


def test_a_real_change_lets_a_recently_left_plan_back():
    clock = Clock()
    s = image_scheduler(clock, confirm=5, recent_intervals=100)
    busy = lambda i: 0.97 if 20 <= i < 60 else 0.2  # noqa: E731
    moves = run(s, clock, lambda i: image_measurements(busy=busy(i)), 120)
    assert len(moves) == 2 and moves[1] < 60 + STABLE_WINDOW_CONFIRMS * 5
    assert s.current.cut == EARLIEST_GPU_CUT


def test_adopt_sets_the_current_plan_even_if_it_cannot_run():
    clock = Clock()
    s = image_scheduler(clock)
    plan = s.adopt(EARLIEST_GPU_CUT, 8, image_measurements(busy=0.97))
    assert not plan.feasible and "cannot run now" in plan.reason
    assert s.current is plan and s.history[-1].reason == "set by the caller"
    with pytest.raises(ValueError, match="cut"):
        s.adopt(0, 1, image_measurements())


def test_a_thread_count_above_the_cores_is_still_judged():
    clock = Clock()
    s = image_scheduler(clock)
    s.adopt(CPU_CUT, 8, image_measurements(gpu=False, cores=8, trainer_cores=0.0))
    # The machine now shows 4 cores (a smaller affinity mask): 8 threads still run, as fast as 4.
    assert run(s, clock, lambda i: image_measurements(gpu=False, cores=4, trainer_cores=0.0), 30) == []


# ---- the plan report ------------------------------------------------------------------------------------

def test_report_has_a_row_per_stage_and_the_throughputs():
    s = image_scheduler()
    m = image_measurements(busy=0.2)
    plan = s.decide(m)
    table = decision_table(plan, m, measured_samples_per_s=2909.0)
    lines = table.splitlines()
    assert lines[0].split() == ["stage", "CPU", "ms/batch", "GPU", "ms/batch", "bytes", "out/sample", "backend",
                                "reason"]
    rows = {line.split()[0]: line for line in lines[2:6]}
    assert list(rows) == ["crop_window", "decode", "resize", "normalize"]
    assert "2,048" in rows["decode"] and "38" in rows["decode"] and " gpu " in rows["decode"]
    assert rows["crop_window"].split()[2] == "-"      # cannot run on the GPU
    assert "predicted  3,636 samples/s" in table and "bound by gpu" in table
    assert "measured   2,909 samples/s (80% of predicted)" in table


def test_report_without_a_gpu_says_so_in_the_gpu_column():
    m = image_measurements(gpu=False)
    plan = image_scheduler().decide(m)
    table = decision_table(plan, m)
    rows = table.splitlines()[2:6]
    assert all("no GPU" in row for row in rows)
    assert "measured" not in table and "none on this machine" in table


def test_report_dict_is_json_and_matches_the_plan():
    m = dataclasses.replace(image_measurements(busy=0.2), samples_per_s=2500.0)
    plan = image_scheduler().decide(m)
    data = json.loads(json.dumps(decision_dict(plan, m)))
    assert data["placement"] == "gpu" and data["cut"] == plan.cut and data["threads"] == plan.threads
    assert data["measured_samples_per_s"] == 2500.0
    assert math.isclose(data["predicted_samples_per_s"], plan.samples_per_s)
    assert [st["backend"] for st in data["stages"]] == ["cpu", "gpu", "gpu", "gpu"]
    assert data["stages"][1]["cpu_ms_per_batch"] == pytest.approx(8e-3 * BATCH * 1000)
    assert data["stages"][0]["gpu_ms_per_batch"] is None
    assert data["gpu"]["memory_total_bytes"] == 80 * GiB


def test_report_rejects_what_is_not_a_plan():
    m = image_measurements()
    with pytest.raises(TypeError, match="decision must be a PlacementDecision, got str"):
        decision_table("gpu", m)
    plan: PlacementDecision = image_scheduler().decide(m)
    other = dataclasses.replace(m, costs=m.costs[:2])
    with pytest.raises(ValueError, match="no cost"):
        decision_dict(plan, other)
