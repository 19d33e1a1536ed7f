"""The simulated trainer of `feedline bench --trainer-step-ms`: its accounting with fake loaders whose batch
times are known, the efficiency formula, the report's keys at tiny sizes, and the flag's errors.

These test the arithmetic, never the speed of a real loader: bounds are generous (other work may share the
machine), and only fake loaders' times are compared with what they were told to take."""
import itertools
import json
import math
import queue
import statistics
import threading
import time

import numpy as np
import pytest

from feedline.benchmarks import criteo_bench, image_baselines, image_bench, trainer
from feedline.datagen.synthetic_criteo import make_criteo
from feedline.benchmarks.trainer import (alternate, auto_step_s, check_trainer_step, efficiency, paired_efficiencies,
                                         paired_rounds, resolve_step_s, run_trainer, trainer_summary)
from feedline.cli import main
from feedline.loader import latency
from feedline.pipelines import image

SIZE = 8


def made_on_the_iterating_thread(batch_s: float, taken: list | None = None):
    """A loader that makes each batch inside next(), as a loader with no threads of its own does."""
    while True:
        time.sleep(batch_s)
        if taken is not None:
            taken.append(1)
        yield {"x": np.zeros((SIZE, 2))}


class MadeInTheBackground:
    """A loader that makes batches on a thread of its own, ``depth`` ahead, ``batch_s`` each."""

    def __init__(self, batch_s: float, depth: int = 2):
        self.queue: queue.Queue = queue.Queue(depth)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._make, args=(batch_s,), daemon=True)
        self.thread.start()

    def _make(self, batch_s):
        while not self.stop.is_set():
            time.sleep(batch_s)
            batch = {"x": np.zeros((SIZE, 2))}
            while not self.stop.is_set():
                try:
                    self.queue.put(batch, timeout=0.05)
                    break
                except queue.Full:
                    pass

    def __iter__(self):
        return self

    def __next__(self):
        return self.queue.get()

    def close(self):
        self.stop.set()
        self.thread.join()


def test_a_loader_on_the_trainers_thread_makes_it_wait_for_every_batch():
    batch_s, step_s, batches = 0.02, 0.02, 10
    run = run_trainer(made_on_the_iterating_thread(batch_s), batches, step_s)
    assert run["batches"] == batches and run["samples"] == batches * SIZE
    # the loop cannot take less than its sleeps; the wait share is near batch / (batch + step) = 0.5
    assert run["seconds"] >= batches * (batch_s + step_s) * 0.99
    assert run["wait_s"] >= batches * batch_s * 0.99
    assert run["samples_per_s"] <= SIZE / (batch_s + step_s) * 1.01
    assert 0.3 < run["wait_share"] < 0.7
    assert math.isclose(run["wait_share"], run["wait_s"] / run["seconds"])
    assert run["slept_s"] >= step_s * 0.99
    assert math.isclose(run["demand_samples_per_s"], SIZE / step_s)


def test_with_no_step_the_trainer_only_waits():
    run = run_trainer(made_on_the_iterating_thread(0.01), 8, 0.0)
    assert run["wait_share"] > 0.8
    assert run["demand_samples_per_s"] == math.inf and run["slept_s"] == 0.0


def test_a_loader_working_in_the_background_hides_behind_the_step():
    loader = MadeInTheBackground(batch_s=0.005)
    try:
        step_s = 0.03
        run = run_trainer(loader, 10, step_s, warmup=2)
    finally:
        loader.close()
    assert run["wait_share"] < 0.3  # the batch was ready each time; 1 - step/(step+batch) would be 0.14
    assert run["samples_per_s"] <= SIZE / step_s * 1.01
    assert efficiency(run["samples_per_s"], SIZE / 0.005, run["demand_samples_per_s"]) > 0.5


def test_warm_up_is_taken_but_not_timed_and_sync_brackets_the_clock():
    taken, syncs = [], []
    run = run_trainer(made_on_the_iterating_thread(0.0, taken), 5, 0.001, sync=lambda: syncs.append(1), warmup=3)
    assert len(taken) == 8 and run["batches"] == 5 and run["samples"] == 5 * SIZE
    assert len(syncs) == 2  # before the clock starts and before it stops


def test_the_trainer_needs_an_endless_stream_and_a_valid_step():
    with pytest.raises(ValueError, match="endless"):
        run_trainer(iter([{"x": np.zeros(3)}] * 2), 5, 0.0)
    for bad in (-0.001, math.nan, math.inf, True):
        with pytest.raises(ValueError, match="step_s"):
            run_trainer(made_on_the_iterating_thread(0.0), 1, bad)


def test_efficiency_is_delivered_over_the_smaller_of_capacity_and_demand():
    assert efficiency(50.0, 100.0, 100.0) == 0.5
    assert efficiency(60.0, 80.0, 100.0) == 0.75  # the loader is the limit
    assert efficiency(60.0, 200.0, 100.0) == 0.6  # the trainer is the limit
    assert efficiency(90.0, 90.0, math.inf) == 1.0  # no step: capacity is the limit
    for bad in ((-1.0, 1.0, 1.0), (1.0, 0.0, 1.0), (1.0, 1.0, 0.0), (math.nan, 1.0, 1.0)):
        with pytest.raises(ValueError):
            efficiency(*bad)


def test_trainer_step_values():
    assert check_trainer_step(None) is None and check_trainer_step("auto") == "auto"
    assert check_trainer_step(5) == 5.0 and check_trainer_step(0.25) == 0.25
    for bad in (0, -1, math.nan, math.inf):
        with pytest.raises(ValueError, match="trainer_step_ms"):
            check_trainer_step(bad)
    for bad in ("fast", True, [5]):
        with pytest.raises(TypeError, match="trainer_step_ms"):
            check_trainer_step(bad)


def fake_run(samples_per_s: float, *, batches: int = 10, size: int = SIZE, step_s: float = 0.0,
             wait_share: float = 0.0) -> dict:
    seconds = batches * size / samples_per_s
    return {"samples_per_s": samples_per_s, "batches": batches, "samples": batches * size, "seconds": seconds,
            "wait_s": wait_share * seconds, "wait_share": wait_share, "step_s": step_s, "slept_s": step_s,
            "demand_samples_per_s": size / step_s if step_s else math.inf}


def test_auto_step_is_the_loaders_own_batch_time_and_the_summary_adds_up():
    capacity = {"feedline": [fake_run(400.0), fake_run(380.0), fake_run(420.0)],
                "baseline": [fake_run(100.0), fake_run(110.0), fake_run(90.0)]}
    assert math.isclose(auto_step_s(capacity["feedline"]), SIZE / 400.0)  # median batch rate: 50 batches/s
    assert math.isclose(resolve_step_s("auto", capacity["feedline"]), 0.02)
    assert resolve_step_s(7.0, capacity["feedline"]) == 0.007
    step_s = 0.02  # demand: 400 samples/s
    loaded = {"feedline": [fake_run(300.0, step_s=step_s, wait_share=0.2)] * 3,
              "baseline": [fake_run(80.0, step_s=step_s, wait_share=0.75), fake_run(60.0, step_s=step_s),
                           fake_run(50.0, step_s=step_s)]}
    summary = trainer_summary(capacity, loaded, step_s, auto=True)
    assert summary["trainer_step_ms"] == 20.0 and summary["trainer_step_auto"] is True
    assert math.isclose(summary["trainer_step_measured_ms"], 20.0)
    assert math.isclose(summary["demand_samples_per_s"], 400.0)
    assert summary["capacity_samples_per_s"] == 400.0 and summary["delivered_samples_per_s"] == 300.0
    assert math.isclose(summary["efficiency"], 300.0 / 400.0)
    assert summary["trainer_wait_share"] == 0.2
    assert summary["baseline_capacity_samples_per_s"] == 100.0
    assert summary["baseline_delivered_samples_per_s"] == 60.0
    assert math.isclose(summary["baseline_efficiency"], 60.0 / 100.0)
    assert math.isclose(summary["delivered_speedup"], 300.0 / 60.0)
    assert summary["delivered_speedup_per_round"] == [3.75, 5.0, 6.0]
    alone = trainer_summary({"feedline": capacity["feedline"]}, {"feedline": loaded["feedline"]}, step_s,
                            auto=False, baseline=None)
    assert "delivered_speedup" not in alone and not any(k.startswith("baseline_") for k in alone)


def test_rounds_alternate_between_the_loaders():
    turns = []
    streams = {"a": made_on_the_iterating_thread(0.0), "b": made_on_the_iterating_thread(0.0)}
    runs = alternate(streams, rounds=3, per_round=4, untimed=1, step_s=0.001, on_turn=turns.append)
    assert turns == ["a", "b"] * 3
    assert [len(r) for r in runs.values()] == [3, 3] and all(r["batches"] == 4 for r in runs["a"])


def test_paired_rounds_put_every_trainer_round_between_two_capacity_rounds():
    turns = []
    streams = {"a": made_on_the_iterating_thread(0.0), "b": made_on_the_iterating_thread(0.001)}

    def maker(name):
        def make():
            turns.append(name)
            return streams[name]
        return make

    runs = paired_rounds({"a": maker("a"), "b": maker("b")}, readahead={"a": 1, "b": 0}, rounds=3, per_round=4,
                         step=2.0, main="a")
    assert runs["step_s"] == 0.002 and runs["untimed"] == 1 and runs["per_round"] == {"a": 4, "b": 4}
    assert [len(r) for r in runs["capacity"].values()] == [4, 4]
    assert [len(r) for r in runs["loaded"].values()] == [3, 3]
    assert all(r["step_s"] == 0.0 for r in runs["capacity"]["a"]) and all(r["step_s"] == 0.002 for r in runs["loaded"]["a"])
    assert turns == ["a", "b"]  # each stream opened once, epoch after epoch
    auto = paired_rounds({"a": lambda: made_on_the_iterating_thread(0.002)}, readahead={"a": 0}, rounds=1,
                         per_round=4, step="auto", round_s=0.02, main="a")
    # the first, untimed round sets the round's length: ~0.02 s of ~2 ms batches, never under the minimum
    assert auto["per_round"]["a"] >= 4 and auto["step_s"] == auto_step_s(auto["capacity"]["a"][:1])
    alone = paired_rounds({"a": lambda: made_on_the_iterating_thread(0.0)}, readahead={"a": 0}, rounds=3,
                          per_round=4, main="a")
    assert alone["loaded"] is None and alone["step_s"] is None and len(alone["capacity"]["a"]) == 3


def test_ceiling_rounds_run_the_same_trainer_over_a_loader_that_costs_nothing():
    turns = []
    slow = made_on_the_iterating_thread(0.003)

    def timed(stream, batches, step_s, sync=None, *, warmup=0, per_step=False):
        turns.append(("free" if isinstance(stream, itertools.repeat) else "a", batches, step_s, warmup))
        return run_trainer(stream, batches, step_s, sync, warmup=warmup)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainer, "run_trainer", timed)
        runs = paired_rounds({"a": lambda: slow}, readahead={"a": 1}, rounds=2, per_round=4, step=2.0, main="a",
                             ceiling=True)
    # after each turn of trainer (2 ms) and capacity rounds, a ceiling round with the same step and batches
    assert turns == [("a", 4, 0.0, 1), ("a", 4, 0.002, 1), ("a", 4, 0.0, 1), ("free", 4, 0.002, 1),
                     ("a", 4, 0.002, 1), ("a", 4, 0.0, 1), ("free", 4, 0.002, 1)]
    assert len(runs["ceiling"]) == 2 and all(r["samples"] == 4 * SIZE for r in runs["ceiling"])
    summary = trainer.ceiling_summary(runs["ceiling"], runs["step_s"])
    each = [r["samples_per_s"] / r["demand_samples_per_s"] for r in runs["ceiling"]]
    assert summary["trainer_ceiling_efficiency"] == pytest.approx(statistics.median(each))
    assert summary["trainer_ceiling_efficiency_per_round"] == [round(e, 3) for e in each]
    # a sleep never ends early: at most 1, no negative overrun
    assert 0 < summary["trainer_ceiling_efficiency"] <= 1 and summary["trainer_ceiling_overrun_ms"] >= 0
    assert summary["trainer_ceiling_overrun_ms"] == pytest.approx(
        1e3 * (statistics.median(r["slept_s"] for r in runs["ceiling"]) - 0.002))
    # no step, or no ceiling asked for: no ceiling rounds
    assert paired_rounds({"a": lambda: slow}, readahead={"a": 0}, rounds=1, per_round=2, main="a",
                         ceiling=True)["ceiling"] is None
    assert paired_rounds({"a": lambda: slow}, readahead={"a": 0}, rounds=1, per_round=2, step=1.0,
                         main="a")["ceiling"] is None


def test_the_remote_benchs_trainer_turns_end_with_a_ceiling_round():
    from feedline.benchmarks.remote_bench import trainer_turns

    turns = []
    streams = {"local": made_on_the_iterating_thread(0.002), "remote": made_on_the_iterating_thread(0.001)}
    like = fake_run(400.0, size=5)
    loaded, ceiling = trainer_turns(streams, like, rounds=2, per_round=3, untimed=1, step_s=0.002,
                                    on_turn=turns.append)
    assert turns == ["local", "remote", "trainer ceiling"] * 2
    assert list(loaded) == ["local", "remote"] and [len(r) for r in loaded.values()] == [2, 2]
    # the same step and batches as the loaders' rounds, over batches of `like`'s size (5, where the loaders' are 8)
    assert len(ceiling) == 2 and all(r["batches"] == 3 and r["samples"] == 15 and r["step_s"] == 0.002
                                     for r in ceiling)
    summary = trainer.ceiling_summary(ceiling, 0.002)
    assert 0 < summary["trainer_ceiling_efficiency"] <= 1 and len(summary["trainer_ceiling_efficiency_per_round"]) == 2


def test_a_paired_round_counts_against_the_capacity_around_it():
    capacity = [fake_run(400.0), fake_run(200.0), fake_run(400.0)]
    loaded = [fake_run(250.0, step_s=SIZE / 400.0), fake_run(300.0, step_s=SIZE / 400.0)]
    # round 0: capacity 2 x 80 samples / (0.2 + 0.4) s = 266.7 < demand 400; round 1: the same pair of rounds
    assert [round(e, 4) for e in paired_efficiencies(capacity, loaded)] == [round(250 / (160 / 0.6), 4),
                                                                            round(300 / (160 / 0.6), 4)]
    summary = trainer_summary({"feedline": capacity}, {"feedline": loaded}, SIZE / 400.0, auto=True, baseline=None,
                              paired=True)
    assert summary["efficiency"] == statistics.median(paired_efficiencies(capacity, loaded))
    with pytest.raises(ValueError, match="one capacity round more"):
        paired_efficiencies(capacity[:2], loaded)


# ---- the benchmarks at tiny sizes -----------------------------------------------------------------------------

TRAINER_KEYS = ("trainer_step_ms", "capacity_samples_per_s", "delivered_samples_per_s", "efficiency",
                "trainer_wait_share")
BASELINE_TRAINER_KEYS = ("baseline_capacity_samples_per_s", "baseline_delivered_samples_per_s",
                         "delivered_speedup")


@pytest.fixture
def quick(monkeypatch):
    """No settle pauses, and a stand-in for the decode bound (its own spawned pool is not under test here)."""
    monkeypatch.setattr(image_bench, "SETTLE_S", 0.0)
    monkeypatch.setattr(criteo_bench, "SETTLE_S", 0.0)
    monkeypatch.setattr(criteo_bench, "ROUND_S", None)
    monkeypatch.setattr(image_baselines, "decode_bound", lambda files, workers: {
        "bound_samples_per_s": 1000.0, "bound_source": "stand-in"})


def bench_json(tmp_path, argv) -> dict:
    out = tmp_path / "bench.json"
    assert main(["bench", *argv, "--no-progress", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def check_trainer_keys(result: dict, *, baseline: bool) -> None:
    for key in TRAINER_KEYS + (BASELINE_TRAINER_KEYS if baseline else ()):
        assert isinstance(result[key], float) and result[key] > 0, key
    assert 0.0 <= result["trainer_wait_share"] <= 1.0
    # paired rounds: the median of the rounds' own efficiencies, each against the capacity rounds around it
    assert result["efficiency"] == pytest.approx(statistics.median(result["efficiency_per_round"]), abs=5e-4)
    assert len(result["efficiency_per_round"]) == result["rounds"]
    assert math.isclose(result["trainer_step_overrun_ms"],
                        result["trainer_step_measured_ms"] - result["trainer_step_ms"])
    if baseline:
        assert math.isclose(result["delivered_speedup"], result["delivered_samples_per_s"]
                            / result["baseline_delivered_samples_per_s"])
    else:
        assert not any(k in result for k in BASELINE_TRAINER_KEYS)
    # the trainer's own ceiling, measured in the same run: one round after each turn, same step; a sleep never
    # ends early, so it is at most 1 and its overrun is never negative
    assert len(result["trainer_ceiling_efficiency_per_round"]) == result["rounds"]
    assert 0 < result["trainer_ceiling_efficiency"] <= 1 and result["trainer_ceiling_overrun_ms"] >= 0
    assert 0 <= result["trainer_ceiling_wait_share"] < 1
    assert any(note.startswith("trainer_ceiling_efficiency: ") for note in result["notes"])
    # the step's overrun split into waking late and waiting for the GIL, for every side's trainer rounds
    assert trainer.SPLIT_NOTE in result["notes"]
    for prefix in ("trainer_", "trainer_ceiling_") + (("baseline_trainer_",) if baseline else ()):
        late, gil, share = (result[prefix + k] for k in ("woke_late_ms", "gil_wait_ms", "gil_wait_share"))
        if trainer.native_sleep() is None:
            assert late is gil is share is None
            continue
        assert late >= 0 and gil >= 0 and 0 <= share < 1
        if result["rounds"] == 1 and prefix == "trainer_":  # one round: the overrun is exactly the two
            assert math.isclose(result["trainer_step_overrun_ms"], late + gil, abs_tol=1e-6)


def test_image_train_with_auto_step_and_the_torchvision_baseline(image_dir, tmp_path, quick):
    result = bench_json(tmp_path, ["--pipeline", "image-train", "--data", str(image_dir), "--batch-size", "4",
                                   "--batches", "2", "--rounds", "1", "--trainer-step-ms", "auto"])
    check_trainer_keys(result, baseline=True)
    assert result["trainer_step_auto"] is True
    # auto: the step is feedline's own batch time in its first round with no trainer (the capacity reported is
    # the median of that round and the one after the trainer round)
    assert math.isclose(result["demand_samples_per_s"], 4 * 1000 / result["trainer_step_ms"], rel_tol=1e-9)
    assert result["capacity_samples_per_s"] == result["feedline_samples_per_s"]
    assert result["baseline_capacity_samples_per_s"] == result["baseline_samples_per_s"]
    # one worker per core, prefetch_factor 2: a round is at least 4x that read-ahead, which is taken untimed first
    read_ahead = result["readahead_batches"]
    assert read_ahead["baseline"] == 2 * result["cores"] and read_ahead["feedline"] >= 1
    assert result["untimed_batches_per_round"] == max(read_ahead.values())
    assert result["batches_per_round"] >= 4 * max(read_ahead.values())
    assert result["batches"] == result["batches_per_round"] * result["rounds"]


def test_image_val_with_a_fixed_step_and_no_baseline(image_dir, tmp_path, quick):
    result = bench_json(tmp_path, ["--pipeline", "image-val", "--data", str(image_dir), "--batch-size", "4",
                                   "--batches", "2", "--rounds", "1", "--trainer-step-ms", "5",
                                   "--baseline", "none"])
    check_trainer_keys(result, baseline=False)
    assert result["trainer_step_ms"] == 5.0 and result["trainer_step_auto"] is False
    assert math.isclose(result["demand_samples_per_s"], 4 / 0.005)


def test_image_output_without_the_flag_is_as_before(image_dir, tmp_path, quick):
    result = bench_json(tmp_path, ["--pipeline", "image-val", "--data", str(image_dir), "--batch-size", "4",
                                   "--batches", "2", "--rounds", "1", "--baseline", "none"])
    assert result["feedline_samples_per_s"] > 0 and result["bound_samples_per_s"] == 1000.0
    assert result["notes"] == [image_bench.bound_note(image.val(str(image_dir)))]
    assert "an estimate, not a limit" in result["notes"][0] and "noise" in result["notes"][0]


def test_image_train_says_why_it_can_pass_its_decode_bound(image_dir, tmp_path, quick):
    result = bench_json(tmp_path, ["--pipeline", "image-train", "--data", str(image_dir), "--batch-size", "4",
                                   "--batches", "2", "--rounds", "1", "--baseline", "none"])
    assert result["fraction_of_bound"] == result["feedline_samples_per_s"] / result["bound_samples_per_s"]
    assert "decodes only each crop window" in result["notes"][0]
    assert "fraction_of_bound can exceed 1" in result["notes"][0]
    assert not any(k.startswith(("trainer_", "capacity_", "delivered_", "efficiency")) for k in result)


@pytest.fixture(scope="module")
def criteo_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("criteo_bench") / "day.tsv"
    make_criteo(path, 3000, seed=0)
    return path


@pytest.mark.parametrize("step", ["5", "auto"])
def test_criteo_with_a_trainer(criteo_file, tmp_path, quick, step, kernels_warmed_once):
    result = bench_json(tmp_path, ["--pipeline", "criteo", "--data", str(criteo_file), "--batch-size", "512",
                                   "--rounds", "1", "--trainer-step-ms", step])
    check_trainer_keys(result, baseline=True)
    assert result["trainer_step_auto"] is (step == "auto")
    if step == "5":
        assert result["trainer_step_ms"] == 5.0
    # end to end (opening and read_csv included) and steady state (after them), both sides counted alike
    assert result["rows"] == result["baseline_rows"] == 3000
    assert 0 <= result["open_s"] <= result["first_batch_s"] and result["first_batch_s"] > 0
    assert math.isclose(result["speedup"], result["feedline_samples_per_s"] / result["baseline_samples_per_s"])
    assert math.isclose(result["steady_speedup"], result["feedline_steady_samples_per_s"]
                        / result["baseline_steady_samples_per_s"])
    assert result["feedline_samples_per_s"] < result["feedline_steady_samples_per_s"]  # the same rows, plus opening
    assert result["baseline_samples_per_s"] < result["baseline_steady_samples_per_s"]  # the same rows, plus read_csv
    assert min(result["batches_per_round"].values()) >= 4 * result["untimed_batches_per_round"]
    assert result["trainer_slice"] is latency.enabled()
    assert any(note.startswith("efficiency: ") for note in result["notes"])
    # the first epoch and the capacity are both reported, and the report says why they differ: 3,000 rows stay
    # parsed in the Loader's chunk cache after the first epoch
    assert result["feedline_first_epoch_samples_per_s"] > 0 and result["capacity_samples_per_s"] > 0
    assert result["cached_after_first_epoch"] is True
    assert any("page cache" in note for note in result["notes"])
    assert any("3,000 rows fit in the Loader's chunk cache" in note and "cached rate" in note
               for note in result["notes"])


def test_a_file_larger_than_the_chunk_cache_is_not_called_cached():
    assert criteo_bench.cached_note("feedline", 131_072, 65_536) is not None
    assert criteo_bench.cached_note("feedline", 131_073, 65_536) is None
    assert criteo_bench.cached_note("feedline", 10, None) is None  # not a streamed table


def test_criteo_timed_batches_report_only_steady_figures(criteo_file, kernels_warmed_once):
    result = criteo_bench.bench_criteo(criteo_file, batch_size=256, batches=3, baseline_rows=1000, progress=False)
    assert result["rows"] == 3 * 256 and result["baseline_rows"] == 1000
    assert result["first_batch_s"] >= result["open_s"] >= 0 and result["first_batch_s"] > 0
    assert result["steady_speedup"] > 0 and "speedup" not in result and "feedline_samples_per_s" not in result
    assert not any(k.startswith("trainer_") for k in result)


@pytest.mark.parametrize("argv,message", [
    (["--pipeline", "image-train", "--data", ".", "--trainer-step-ms", "-1"],
     "argument --trainer-step-ms: expected a number of milliseconds > 0 or 'auto', got '-1'"),
    (["--pipeline", "image-train", "--data", ".", "--trainer-step-ms", "fast"],
     "argument --trainer-step-ms: expected a number of milliseconds > 0 or 'auto', got 'fast'"),
    (["--pipeline", "criteo", "--data", ".", "--trainer-step-ms", "0"], "argument --trainer-step-ms"),
    (["--pipeline", "criteo", "--data", ".", "--trainer-step-ms", "nan"], "argument --trainer-step-ms"),
    (["--pipeline", "image-val", "--data", ".", "--rounds", "0"], "--rounds: expected a positive integer, got 0"),
    (["--op", "hash", "--trainer-step-ms", "5"], "--trainer-step-ms applies to --pipeline"),
    (["--pipeline", "image-train", "--data", ".", "--placement", "auto", "--trainer-step-ms", "auto"],
     "--trainer-step-ms applies to a fixed --placement"),
])
def test_bad_trainer_flags_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
