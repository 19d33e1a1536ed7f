"""One clock times the trainer's waits: the scheduler (``auto``) and the Loader's live figures (``loader.stats()``)
read the same records, each from its own mark, so a reset of one leaves the other's window as it was."""
import pytest

from feedline.loader import Loader
from feedline.loader.placement import controller as controller_module
from feedline.loader.placement.monitors import WaitMonitor
from feedline.loader.stats import DeliveryMeter
from feedline.pipelines import image


class Ticks:
    """A clock that moves ``tick`` seconds at every reading."""

    def __init__(self, tick: float):
        self.now, self.tick, self.readings = 0.0, tick, 0

    def __call__(self) -> float:
        self.now += self.tick
        self.readings += 1
        return self.now


def test_the_scheduler_and_the_live_figures_read_one_clock(image_dir, monkeypatch):
    ticks = Ticks(1e-3)  # every wait: asked at one reading, got at the next (1 ms); every step 1 ms likewise
    monkeypatch.setattr(controller_module, "WaitMonitor", lambda: WaitMonitor(clock=ticks))
    with Loader(image.train(image_dir, size=32, output="uint8"), batch_size=4, placement="auto", seed=0) as loader:
        batches = [len(b["index"]) for b in loader]
        auto = loader.placer.auto
        assert auto.wait is loader.meter.monitor
        assert ticks.readings == 2 * len(batches)  # one clock: read once when the trainer asks, once when it gets
        window = batches[-auto.wait.window:]
        reading = auto.wait.sample()
        assert (reading.mean_wait_s, reading.mean_step_s, reading.batches, reading.stdev_wait_s) == (
            pytest.approx(1e-3), pytest.approx(1e-3), len(window), pytest.approx(0.0, abs=1e-12))
        stats = loader.stats()
        assert stats["batches"] == len(batches)
        # from the first batch's delivery to the last's: a step and a wait per later batch, half of it waiting
        assert stats["trainer_wait_share"] == pytest.approx(0.5)
        assert stats["delivered_samples_per_s"] == pytest.approx(sum(batches[1:]) / (2e-3 * (len(batches) - 1)))


def test_each_reader_resets_its_own_window():
    ticks = Ticks(0.0)
    monitor = WaitMonitor(window=8, clock=ticks)
    meter = DeliveryMeter(monitor, window=4)
    for k in range(6):
        with meter.waiting():
            ticks.now += 0.01 * k
        meter.delivered(10)
        ticks.now += 0.1
    assert monitor.sample().batches == 6 and meter.reading()["batches"] == 4   # each its own window
    meter.reset()                       # the trainer paused on purpose: its live figures start anew ...
    assert meter.reading()["batches"] == 0
    assert monitor.sample().batches == 6  # ... the scheduler's window does not
    with meter.waiting():
        ticks.now += 0.5
    meter.delivered(10)
    monitor.reset()                     # a re-plan: the scheduler's window starts anew ...
    assert monitor.sample().batches == 0
    assert meter.reading()["batches"] == 1  # ... the live figures' does not
    with pytest.raises(TypeError, match="monitor must be a WaitMonitor or None, got float"):
        DeliveryMeter(1.0)
