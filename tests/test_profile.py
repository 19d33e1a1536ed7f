"""``feedline profile`` / ``profile_loader``: a stage planted with a known cost per sample, in an image pipeline
and in a table, is named the bottleneck with its share and measured within 15% of its cost; the profile gives
the Loader back where it was; ``feedline profile`` writes its files and prints its table; bad input is named.

The planted stages burn CPU time on their own thread (``time.thread_time``), the time the stage profiler
measures (the scheduler models CPU stages in core-seconds); a stage that sleeps shows in the measured rate, not
in its stage's time (see the README)."""
import dataclasses
import json
import time

import pytest
import torch

from feedline.cli import main
from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import Loader
from feedline.loader import profile_advice
from feedline.loader.devices import available_cores, gpu_available
from feedline.loader.profile import last_profile, profile_loader
from feedline.loader.stats import DeliveryMeter, log_stats, loader_stats
from feedline.pipelines import image
from feedline.pipelines.criteo import criteo
from feedline.pipelines.features import FeatureStage
from feedline.pipelines.stage import CPU_ONLY

IMAGE_MS = 8.0          # planted CPU time per image
ROW_US = 250.0          # planted CPU time per table row (parsing an uncached chunk alone can take 20-40 us, more on a loaded machine)


def burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def planted(images):
    burn(IMAGE_MS / 1000 * len(images))
    return images


@dataclasses.dataclass(frozen=True)
class SlowColumn(FeatureStage):
    """Gives ``dense`` back as it came, after a known CPU time per row: a column that is slow to make."""

    name = "slow_column"
    backends = CPU_ONLY

    def run(self, data, xp, out=None):
        burn(ROW_US / 1e6 * data["dense"].shape[0])
        return {"dense": data["dense"]}


def assert_planted(profile, stage: str, planted_ms: float, resource: str = "cpu") -> None:
    rows = {s["stage"]: s for s in profile.stages}
    assert profile.bottleneck["stage"] == stage
    assert profile.bottleneck["resource"] == resource
    assert abs(rows[stage]["ms_per_sample"] - planted_ms) <= 0.15 * planted_ms, rows[stage]
    others = sum(s["ms_per_sample"] for s in profile.stages if s["stage"] != stage)
    assert profile.bottleneck["share"] == pytest.approx(rows[stage]["ms_per_sample"] / (rows[stage]["ms_per_sample"]
                                                                                         + others))
    assert profile.bottleneck["share"] > 0.5
    assert sum(s["share"] for s in profile.stages) == pytest.approx(1.0)


@pytest.fixture(scope="module")
def planted_images(image_dir):
    return image.pipeline(image_dir, [image.decode(), image.resize((32, 32)), image.custom(planted, name="planted"),
                                      image.normalize()])


def test_a_planted_image_stage_is_the_bottleneck_with_its_cost(planted_images):
    with Loader(planted_images, 8, placement="cpu", num_threads=2, seed=3) as loader:
        before = loader.state_dict()
        profile = profile_loader(loader, batches=4, trainer_step_ms=5)
        # a custom stage runs on the batch thread, whatever the thread count: that one thread bounds the rate
        assert_planted(profile, "planted", IMAGE_MS, resource="thread")
        assert loader.state_dict() == before and loader.epoch_summaries == {}
        first = next(iter(loader))["index"]
    with Loader(planted_images, 8, placement="cpu", num_threads=2, seed=3) as untouched:
        assert torch.equal(first, next(iter(untouched))["index"])  # the profile took nothing from the epoch
    assert [s["backend"] for s in profile.stages] == ["cpu"] * 5
    current = [p for p in profile.placements if p["current"]]
    assert len(current) == 1 and current[0]["placement"] == "cpu" and current[0]["threads"] == 2
    assert current[0]["measured_samples_per_s"] == profile.measured["capacity_samples_per_s"]
    assert len(profile.timeline) == 4
    assert all(asked <= got <= done and done - got >= 0.005 for asked, got, done in profile.timeline)
    assert profile.measured["delivered_samples_per_s"] > 0 and profile.headroom_samples_per_s > 0
    advice = profile.recommendation  # 2 threads for 2 cores here at most: the planted stage is what to change
    if available_cores() <= 2:
        assert advice["action"] == "stage" and "'planted'" in advice["words"] and advice["bound"]
        assert advice["predicted_gain"] > 2 and advice["alternatives"]
    assert last_profile(loader) is profile
    data = json.loads(profile.to_json())
    assert data["bottleneck"]["stage"] == "planted" and len(data["stages"]) == 5


@pytest.fixture(scope="module")
def small_table(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "day.tsv"
    make_criteo(path, rows=3000, seed=0)
    return str(path)


def test_a_planted_table_column_is_the_bottleneck_with_its_cost(small_table):
    spec = criteo(small_table)
    spec = dataclasses.replace(spec, stages=spec.stages + (SlowColumn(("dense",), ("dense",)),))
    # A shuffle buffer of the file's 3,000 rows: the same order as the default 65,536 (one buffer-full, the whole
    # file), but the profile's batch path, two buffer-fulls of batches, is 24 batches instead of 512.
    with Loader(spec, 256, placement="cpu", num_threads=1, shuffle_buffer=3000) as loader:
        profile = profile_loader(loader, batches=3)
    assert_planted(profile, "slow_column", ROW_US / 1000)
    if available_cores() > 1:  # one thread of several cores: the model's concrete change comes first
        advice = profile.recommendation
        assert advice["action"] == "threads" and not advice["bound"]
        cores = available_cores()  # the model: the workers' part over min(threads, free cores), the batch thread's
        # own part beside them (at most one core more), nothing else binds
        b = profile.batch_size
        core = sum(s["cpu_ms_per_sample"] - s["blocked_ms_per_sample"] for s in profile.stages) \
            + profile.batch_costs["forming_ms"] / b
        own = min(profile.batch_costs["batch_thread_ms"] / b, core)
        thread = sum(s["blocked_ms_per_sample"] for s in profile.stages) \
            + (profile.batch_costs["batch_thread_ms"] + profile.batch_costs["hand_off_ms"]) / b
        at = {t: max((core - own) / min(t, cores), core / min(t + 1, cores), thread) for t in (1, cores)}
        assert advice["words"] == f"use num_threads={cores}"
        assert advice["predicted_gain"] == pytest.approx(at[1] / at[cores], rel=1e-6)
        assert 0.9 * cores < advice["predicted_gain"] <= cores  # the batch thread makes little of a table's batch
    assert profile.measured["delivered_samples_per_s"] is None and profile.headroom_samples_per_s is None
    assert "needs a trainer step" in profile.table()


def test_a_profile_mid_training_gives_the_loader_back_and_runs_the_trainers_step(small_table):
    """Broken out of after 2 batches, profiled with the trainer's own step, the Loader then gives what an untouched
    one gives after the same break; the step ran on every batch the profile took with a trainer, and on the
    replayed ones."""
    firsts = []
    for profiled in (False, True):
        with Loader(criteo(small_table), 256, placement="cpu", seed=5) as loader:
            for k, _ in enumerate(loader):
                if k == 1:
                    break
            steps = []
            if profiled:
                profile = profile_loader(loader, batches=3, train_step=lambda batch: steps.append(batch))
                assert len(steps) == loader.prefetch + 3 + 3  # the queue refilled, timed, replayed
                assert profile.measured["trainer_step_ms"] is not None and profile.headroom_samples_per_s > 0
            firsts.append(next(iter(loader))["index"])
    assert torch.equal(*firsts)


def test_profile_arguments_are_checked(planted_images):
    with Loader(planted_images, 8, placement="cpu") as loader:
        with pytest.raises(ValueError, match="batches must be a positive integer, got 0"):
            profile_loader(loader, batches=0)
        with pytest.raises(ValueError, match="trainer_step_ms must be a positive, finite number"):
            profile_loader(loader, trainer_step_ms=-1)
        with pytest.raises(ValueError, match="not both"):
            profile_loader(loader, trainer_step_ms=5, train_step=lambda batch: None)
        with pytest.raises(TypeError, match="train_step must be a function"):
            profile_loader(loader, train_step=5)
    with pytest.raises(TypeError, match="loader must be a feedline.loader.Loader, got DataLoader"):
        profile_loader(torch.utils.data.DataLoader([1, 2, 3]))


def test_the_delivery_meter_counts_the_window():
    now = [0.0]
    meter = DeliveryMeter(window=3, clock=lambda: now[0])
    assert meter.reading()["delivered_samples_per_s"] is None
    for wait, step in ((1.0, 1.0), (0.5, 1.5), (0.0, 2.0), (1.0, 0.0)):
        with meter.waiting():
            now[0] += wait
        meter.delivered(10)
        now[0] += step
    # the last 3 batches: delivered at 2.5, 4.0 and 7.0; after the first of them, 20 samples and waits of 0.0 and
    # 1.0 s over 4.5 s
    assert meter.reading() == {"batches": 3, "window_s": 4.5, "delivered_samples_per_s": 20 / 4.5,
                               "trainer_wait_share": 1 / 4.5}
    with pytest.raises(ValueError, match="window must be a positive integer"):
        DeliveryMeter(window=0)


def test_the_delivery_meter_times_a_take_as_a_wait_and_drops_a_failed_one():
    """``meter.take(get)`` (the Loader's ``next()``) counts as ``with meter.waiting(): get()`` does: the wait, the
    step before it; a fetch that raises is not counted, nor is the step after it."""
    now = [0.0]
    meter = DeliveryMeter(window=8, clock=lambda: now[0])

    def get(wait, fail=False):
        now[0] += wait
        if fail:
            raise KeyError("no batch")
        return "batch"

    assert meter.take(lambda: get(1.0)) == "batch"
    now[0] += 2.0
    with pytest.raises(KeyError):
        meter.take(lambda: get(0.5, fail=True))
    now[0] += 1.0
    assert meter.take(lambda: get(0.25)) == "batch"
    assert meter.monitor.since(0) == [(0.0, 1.0, None, None), (4.5, 4.75, None, None)]
    meter.take(lambda: get(0.0))
    assert meter.monitor.since(0)[-1] == (4.75, 4.75, 0.0, None)


class _Writer:
    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))


def test_stats_and_their_logging(planted_images):
    with Loader(planted_images, 8, placement="cpu", num_threads=1) as loader:
        stats = loader_stats(loader)
        assert stats["placement"] == "cpu" and stats["skipped"] == 0 and stats["stages_measured_by"] is None
        for _ in loader:
            pass
        assert loader_stats(loader)["batches"] == len(loader)
        profile_loader(loader, batches=2)
        stats = loader_stats(loader)
        assert stats["stages_measured_by"] == "loader.profile()" and stats["batches"] == 0
        assert stats["stages"]["planted"]["ms_per_sample"] == pytest.approx(IMAGE_MS, rel=0.15)
        writer, seen = _Writer(), []
        with log_stats(loader, 0.01, callback=seen.append, writer=writer) as logger:
            deadline = time.monotonic() + 5
            while logger.calls < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        assert len(seen) >= 2 and seen[0]["placement"] == "cpu"
        assert ("feedline/threads", 1, 0) in writer.scalars
        with pytest.raises(ValueError, match="needs a callback, a writer"):
            log_stats(loader, 1.0)
        with pytest.raises(TypeError, match="writer must have add_scalar"):
            log_stats(loader, 1.0, writer=object())
        with pytest.raises(ValueError, match="every_s must be a positive, finite number of seconds"):
            log_stats(loader, 0, callback=print)


class _Moving:
    """``loader`` as the stats read it, with a cut the test moves (as a re-plan under auto placement would)."""

    def __init__(self, loader):
        self.loader, self.cut = loader, loader.cut

    def __getattr__(self, name):
        return getattr(self.loader, name)


def test_a_placement_change_comes_as_an_event(planted_images):
    with Loader(planted_images, 8, placement="cpu") as loader:
        moving = _Moving(loader)
        logger = log_stats(moving, 3600.0, callback=lambda stats: None)
        try:
            assert "event" not in logger.log_once() and "event" not in logger.log_once()  # the same placement
            moving.cut = min(planted_images.valid_cuts())
            now = planted_images.describe_cut(moving.cut)
            assert now != "cpu" and logger.log_once()["event"] == f"placement cpu -> {now}"
            assert "event" not in logger.log_once()  # and once only
        finally:
            logger.close()


def test_the_command_writes_both_files_and_prints_the_table(image_dir, tmp_path, capsys):
    out = tmp_path / "profile"
    assert main(["profile", "--pipeline", "image-val", "--data", str(image_dir), "--placement", "cpu",
                 "--batch-size", "8", "--batches", "3", "--trainer-step-ms", "5", "--out", str(out)]) == 0
    shown = capsys.readouterr().out
    for words in ("stage", "decode", "bottleneck", "capacity", "trainer", "headroom", "recommend", "cpu (current)"):
        assert words in shown
    data = json.loads((out / "profile.json").read_text())
    assert data["pipeline"] == "image-val" and [s["stage"] for s in data["stages"]][:2] == ["read", "decode"]
    assert data["placement"]["chosen_by"] == "fixed" and "chosen by auto" not in shown
    assert (out / "profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_profiles_with_the_cache_fixed_off(image_dir, tmp_path):
    out = tmp_path / "profile"
    assert main(["profile", "--pipeline", "image-val", "--data", str(image_dir), "--placement", "cpu",
                 "--batch-size", "8", "--batches", "6", "--cache", "off", "--out", str(out)]) == 0
    measured = json.loads((out / "profile.json").read_text())["measured"]
    assert measured["cache_before"] == measured["cache_after"] == {"use": False, "reason": "not cached: cache='off'"}


def test_without_matplotlib_the_command_writes_the_json_and_says_how(image_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    out = tmp_path / "profile"
    assert main(["profile", "--pipeline", "image-val", "--data", str(image_dir), "--placement", "cpu",
                 "--batch-size", "8", "--batches", "2", "--out", str(out)]) == 0
    assert (out / "profile.json").exists() and not (out / "profile.png").exists()
    assert "pip install 'feedline[plot]'" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--batches", "0"], "argument --batches: expected a positive integer, got 0"),
    (["--batch-size", "x"], "argument --batch-size: expected a positive integer, got 'x'"),
    (["--trainer-step-ms", "-3"], "argument --trainer-step-ms: expected a number of milliseconds > 0 or 'auto'"),
    (["--placement", "tpu"], "argument --placement: invalid choice: 'tpu'"),
    (["--output", "int8"], "argument --output: invalid choice: 'int8'"),
    (["--cache", "sometimes"], "argument --cache: invalid choice: 'sometimes'"),
])
def test_bad_flags_are_named(argv, message, image_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["profile", "--pipeline", "image-val", "--data", str(image_dir), "--out", str(tmp_path / "o"), *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_paths_are_named(image_dir, tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("")
    for argv, message in (
            (["--data", str(image_dir), "--out", str(a_file)],
             f"argument --out: {str(a_file)!r} is a file, not a folder"),
            (["--data", str(image_dir), "--out", str(tmp_path / "no" / "such")], "argument --out: cannot make"),
            (["--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")], "argument --data: "),
            (["--data", str(image_dir)], "the following arguments are required: --out")):
        with pytest.raises(SystemExit) as info:
            main(["profile", "--pipeline", "image-val", *argv])
        assert info.value.code == 2
        assert message in capsys.readouterr().err


def test_a_batch_larger_than_the_data_is_one_line(image_dir, tmp_path, capsys):
    assert main(["profile", "--pipeline", "image-val", "--data", str(image_dir), "--placement", "cpu",
                 "--batch-size", "1000", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("feedline profile: error: last_batch='drop' with batch_size=1000") and "37 samples" in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()


@pytest.mark.skipif(gpu_available(), reason="a GPU placement runs here")
def test_a_gpu_placement_without_a_gpu_is_one_line(image_dir, tmp_path, capsys):
    assert main(["profile", "--pipeline", "image-val", "--data", str(image_dir), "--placement", "gpu",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("feedline profile: error: placement='gpu' needs a CUDA GPU") and "Traceback" not in err


# ---- the conclusions, from synthetic measurements of a machine with a GPU --------------------------------------
US = 1e-6
# image-train's stages: (CPU s/sample, GPU s/sample, bytes out/sample); read runs only on the CPU
COSTS = {"read": (50 * US, None, 100e3), "decode": (1200 * US, 50 * US, 360e3),
         "random_resized_crop": (350 * US, 10 * US, 147e3), "horizontal_flip": (15 * US, 5 * US, 147e3),
         "normalize": (120 * US, 10 * US, 588e3)}


def synthetic(spec, *, gpu_busy: float, cut: int, threads: int = 2):
    from feedline.loader import profile_advice as advice
    from feedline.loader.placement.measurements import Measurements, Resources, StageCost
    from feedline.loader.placement.monitors import GpuReading

    costs = tuple(StageCost(name, cpu, gpu, out) for name, (cpu, gpu, out) in COSTS.items())
    gpu = GpuReading(utilization=gpu_busy, memory_free_bytes=100 * 2 ** 30, memory_total_bytes=140 * 2 ** 30)
    resources = Resources(cores=2, trainer_cpu_cores_busy=0.0, gpu=gpu, trainer_gpu_busy_fraction=gpu_busy,
                          h2d_bytes_per_s=12e9)
    m = advice.model_of(spec, Measurements(costs, 100e3, resources), batch_size=64, on_gpu=True, cut=cut,
                        threads=threads)
    rows = advice.stage_rows(spec, m, cut)
    top = advice.bottleneck(rows, m)
    return advice, m, rows, top


def test_on_a_gpu_machine_the_cpu_placement_is_told_to_decode_on_the_gpu(image_dir):
    spec = image.train(image_dir)
    advice, m, rows, top = synthetic(spec, gpu_busy=0.0, cut=spec.all_cpu)
    # CPU placement: 1,735 us of CPU stages over 2 threads; the float output (588 kB) crosses after them
    cpu_s = sum(c for c, _, _ in COSTS.values()) / 2
    assert m.current.prediction.samples_per_s == pytest.approx(1 / cpu_s)
    copy = rows[-1]
    assert (copy["stage"], copy["backend"]) == ("host-to-device", "pcie")
    assert copy["ms_per_sample"] == pytest.approx(588e3 / 12e9 * 1000)
    assert top["stage"] == "decode" and top["resource"] == "cpu"
    assert top["share"] == pytest.approx(1200 / (1735 + 588e3 / 12e9 * 1e6))
    # all but read on the GPU: 75 us a sample there; the encoded file (100 kB) crosses
    gpu_s = sum(g for _, g, _ in COSTS.values() if g is not None)
    assert gpu_s == pytest.approx(75 * US)
    advice_now = advice.recommend(spec, m, rows, top, cut=spec.all_cpu, threads=2, wait_share=0.5, text_table=False)
    assert advice_now["action"] == "placement" and advice_now["words"].startswith("use placement='gpu'")
    assert advice_now["predicted_gain"] == pytest.approx(cpu_s / gpu_s)
    table = advice.placements(spec, m, spec.all_cpu, 2, measured_samples_per_s=900.0)
    assert {r["placement"]: r["predicted_samples_per_s"] for r in table}["gpu"] == pytest.approx(1 / gpu_s)
    assert [r["measured_samples_per_s"] for r in table if r["current"]] == [900.0]


def test_a_busy_gpu_leaves_the_advice_on_the_cpu_and_a_fed_trainer_needs_none(image_dir):
    spec = image.train(image_dir)
    advice, m, rows, top = synthetic(spec, gpu_busy=0.97, cut=spec.all_cpu)
    table = advice.placements(spec, m, spec.all_cpu, 2, measured_samples_per_s=900.0)
    assert all(r["predicted_samples_per_s"] is None and "97% busy" in r["why_not"] for r in table if not r["current"])
    busy = advice.recommend(spec, m, rows, top, cut=spec.all_cpu, threads=2, wait_share=0.5, text_table=False)
    assert busy["action"] != "placement"
    fed = advice.recommend(spec, m, rows, top, cut=spec.all_cpu, threads=2, wait_share=0.01, text_table=False)
    assert fed["action"] == "none" and "keeps up" in fed["words"]


def test_auto_placement_profiles_only_the_samples_it_makes(image_dir):
    """The stage profiler's plans stop inside an epoch: its costs are per sample made, not per padding slot of the
    rest of the epoch (which the image runner adds when a rank's plans stop early)."""
    spec = image.val(image_dir, size=32)
    with Loader(spec, 8, placement="auto") as loader:
        next(iter(loader))
        assert loader.plan["profile_samples"] == 3 * 8  # 3 batches after a warm-up one, of 37 images
        profile = profile_loader(loader, batches=2)
    assert profile.placement["chosen_by"] == "auto" and "chosen by auto" in profile.table()


def test_a_cache_that_changes_while_the_capacity_is_measured_is_said(image_dir):
    with Loader(image.val(image_dir, size=32), 4, placement="cpu", cache="on") as loader:
        # the first epoch fills the cache, the next reads it (timed from the start: no steady state to wait for)
        profile = profile_loader(loader, batches=2 * len(loader), warmup=1 + loader.prefetch)
    before, after = profile.measured["cache_before"], profile.measured["cache_after"]
    assert before["samples_held"] < after["samples_held"] == len(loader.source) and after["use"]
    note = next(n for n in profile.notes if n.startswith("cache changed while the capacity was measured"))
    assert f"in use, {after['samples_held']:,} samples held)" in note and "mixes the two states" in note


def test_an_unchanged_cache_adds_no_note():
    state = {"use": True, "reason": "cached: cache='on' and it fits", "samples_held": 10}
    assert profile_advice.cache_change(state, dict(state)) is None
    assert profile_advice.cache_change(None, state) is None
    assert "(not in use -> in use)" in profile_advice.cache_change({"use": False, "reason": "not decided yet"},
                                                                   {"use": True, "reason": "cached"})
