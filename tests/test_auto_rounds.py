"""Rounds sized by the noise: alternating rounds go on while the medians' spread is large and stop once they are
stable (or at the cap), a contender wins only beyond the noise, auto placement's thread check decides on such
rounds with each probe's read-ahead taken untimed, and `feedline bench --placement auto` reports the spread."""
import math
import statistics
from types import SimpleNamespace

import pytest

from feedline.benchmarks import placement_bench
from feedline.loader.placement import auto as auto_module
from feedline.loader.placement.auto import AutoPlacement, _Probe
from feedline.loader.placement.rounds import MEDIAN_SE, Rounds, measure_rounds, relative_spread
from feedline.pipelines import image


def sequences(**rates):
    """A measure function giving each contender's rates in turn, and the calls it saw."""
    calls = []
    left = {name: list(values) for name, values in rates.items()}

    def measure(name):
        calls.append(name)
        return left[name].pop(0)
    return measure, calls


def test_the_spread_is_the_relative_standard_error_of_the_median():
    assert relative_spread([90.0, 100.0, 110.0]) == pytest.approx(MEDIAN_SE * 10.0 / math.sqrt(3) / 100.0)
    assert relative_spread([5.0]) == math.inf and relative_spread([0.0, 0.0]) == math.inf


def test_quiet_rounds_stop_at_the_minimum():
    measure, calls = sequences(a=[100, 101, 99, 100], b=[50, 50.5, 49.5, 50])
    rounds = measure_rounds(["a", "b"], measure, min_rounds=3, max_rounds=10, tolerance=0.02)
    assert rounds.stable and rounds.rounds == 3
    assert calls == ["a", "b"] * 3  # alternating, one of each per round
    assert rounds.medians == {"a": 100, "b": 50}


def test_noisy_rounds_go_on_until_the_medians_hold_still():
    noisy = [100, 150, 60, 130, 80] + [100] * 20
    measure, _ = sequences(a=noisy, b=[50] * 25)
    rounds = measure_rounds(["a", "b"], measure, min_rounds=3, max_rounds=25, tolerance=0.05)
    n = rounds.rounds
    assert rounds.stable and n > 5
    # it stopped at the first round where the spread fell within the tolerance, not before, not after
    assert relative_spread(noisy[:n]) <= 0.05 < relative_spread(noisy[:n - 1])
    assert rounds.rates["a"] == tuple(noisy[:n])


def test_rounds_that_never_settle_stop_at_the_cap_and_say_so():
    measure, _ = sequences(a=[60, 140] * 5, b=[50] * 10)
    rounds = measure_rounds(["a", "b"], measure, min_rounds=3, max_rounds=6, tolerance=0.02)
    assert not rounds.stable and rounds.rounds == 6
    report = rounds.report()
    assert report["rounds"] == 6 and report["stable"] is False
    assert report["contenders"]["a"]["spread"] == pytest.approx(relative_spread([60, 140] * 3))
    assert report["contenders"]["a"]["rates"] == [60, 140] * 3


def test_a_contender_wins_only_beyond_the_noise():
    quiet = Rounds({"model": (100.0, 99.0, 101.0), "other": (105.0, 104.0, 106.0)}, 0.02, True)
    # spreads of 0.7% each: 2 x hypot = 2.0%, so 5% is beyond the noise
    assert quiet.beats("other", "model") and quiet.best("model") == "other"
    noisy = Rounds({"model": (100.0, 90.0, 110.0), "other": (105.0, 95.0, 115.0)}, 0.02, False)
    # spreads near 7% each: a 5% lead is within the noise, and the model's choice stays
    assert not noisy.beats("other", "model") and noisy.best("model") == "model"
    assert quiet.best("model", margin=0.10) == "model"  # beyond the noise but under the margin asked for


def test_bad_round_arguments_are_named():
    with pytest.raises(ValueError, match="min_rounds must be"):
        measure_rounds(["a"], lambda c: 1.0, min_rounds=1)
    with pytest.raises(ValueError, match="max_rounds must be"):
        measure_rounds(["a"], lambda c: 1.0, min_rounds=3, max_rounds=2)
    with pytest.raises(ValueError, match="contenders must name at least one"):
        measure_rounds([], lambda c: 1.0)


# ---- auto placement's thread check -------------------------------------------------------------------------
class FakeProbe:
    def __init__(self, rates):
        self.rates = list(rates)
        self.closed = False

    def __call__(self):
        return self.rates.pop(0)

    def close(self):
        self.closed = True


def thread_check(rates_by_threads, threads=2, samples=1_000_000, samples_per_s=100.0):
    """AutoPlacement.check_threads on a plan of ``threads`` predicted at ``samples_per_s``, over an epoch of
    ``samples`` on this rank, with probes giving the rates given."""
    adopted = []
    placement = AutoPlacement.__new__(AutoPlacement)
    placement.scheduler = SimpleNamespace(max_threads=None, adopt=lambda cut, t, m, reason: adopted.append(
        (cut, t, reason)) or SimpleNamespace(cut=cut, threads=t))
    placement.last = None
    placement.batch_size = 4
    placement.orders = lambda batch_size, seed: SimpleNamespace(per_rank=samples)
    probes = {t: FakeProbe(r) for t, r in rates_by_threads.items()}
    plan = SimpleNamespace(cut=5, threads=threads, samples_per_s=samples_per_s)
    chosen = placement.check_threads(plan, probe=lambda cut, t: probes[t])
    assert all(p.closed for p in probes.values())
    return placement, chosen, adopted


def test_no_thread_check_where_an_epoch_takes_less_than_the_check():
    """40 samples at a predicted 100/s: a 0.4 s epoch, shorter than the check's 1.8 s; nothing is probed."""
    placement, chosen, adopted = thread_check({}, samples=40)
    assert chosen.threads == 2 and adopted == [] and "less than the check" in placement.thread_check_rounds["skipped"]


def test_the_thread_check_keeps_the_models_choice_within_the_noise():
    # 1 thread measures 4% faster in the median, but the rounds scatter by ~10%: not beyond the noise
    placement, chosen, adopted = thread_check({2: [100, 80, 120, 95, 105, 90, 110, 100],
                                               1: [104, 84, 124, 99, 109, 94, 114, 104]})
    assert adopted == [] and chosen.threads == 2
    assert placement.thread_check_rounds["rounds"] == auto_module.CHECK_MAX_ROUNDS  # never stable: ran to the cap
    assert placement.thread_check_rounds["stable"] is False


def test_the_thread_check_takes_fewer_threads_that_win_beyond_the_noise():
    placement, chosen, adopted = thread_check({2: [100, 101, 99, 100], 1: [110, 111, 109, 110]})
    assert chosen.threads == 1 and adopted[0][:2] == (5, 1) and "medians of 3 rounds" in adopted[0][2]
    assert placement.scheduler.max_threads == 1
    assert placement.thread_check == {2: 100, 1: 110}


def test_a_probe_takes_its_read_ahead_untimed(monkeypatch):
    """The batches a probe's runner made while another probe was timed are not counted in its own time."""
    monkeypatch.setattr(auto_module, "CHECK_SECONDS", 0.0)  # one timed batch per call
    taken = []

    class Runner:
        def batches(self, plans):
            for plan in plans:
                taken.append(plan)
                yield {"index": list(range(4))}, None

        def close(self):
            pass

    sampler = SimpleNamespace(epoch=lambda e: iter(range(100 * e, 100 * e + 100)))
    probe = _Probe(Runner(), sampler, SimpleNamespace(type="cpu"), untimed=3)
    assert len(taken) == 1  # built and warmed up on one batch
    assert probe() > 0 and len(taken) == 1 + 3 + 1
    probe.close()


def test_the_bench_reports_rounds_and_spread(image_dir, monkeypatch):
    monkeypatch.setattr(placement_bench, "SETTLE_S", 0.0)
    result = placement_bench.bench_placements(image.val(image_dir, size=32), batch_size=4, batches=2, rounds=2,
                                              max_rounds=3, tolerance=0.0, progress=False)
    assert result["rounds"] == 3 and result["stable"] is False  # no spread is within 0: ran to the cap
    # each Loader's whole read-ahead is taken untimed (its queue, its runner's DALI queue, the batch in hand)
    assert result["untimed_batches_per_round"] == 2 * result["auto_prefetch"] + 1
    assert result["batches_per_round"] == 4 * result["untimed_batches_per_round"]
    names = set(result["rates"])
    assert "auto" in names and set(result["spread"]) == names
    for name, rates in result["rates"].items():
        assert len(rates) == 3 and statistics.median(rates) == pytest.approx(
            result["auto_samples_per_s"] if name == "auto" else result["static_samples_per_s"][name])
        assert result["spread"][name] == pytest.approx(relative_spread(rates))
    assert result["auto_history"][-1]["to"] == result["auto_placement"]  # how auto came to its placement
    assert "auto_thread_check" in result
    best = result["best_static_placement"]
    assert result["auto_vs_best_static_noise"] == pytest.approx(
        2.0 * math.hypot(result["spread"]["auto"], result["spread"][best]))
