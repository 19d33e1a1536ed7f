"""Monitors: NVML missing or failing reads as 'no GPU', waits are timed exactly, CPU readings stay in range."""
import contextlib
import sys
import types

import pytest

from feedline.loader.placement.monitors import (CpuMonitor, CpuReading, GpuMonitor, GpuReading, NoGpu, NvmlGpuMonitor,
                                      PsutilCpuMonitor, ScriptedMonitor, WaitMonitor, WaitReading)

GiB = 2 ** 30


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def fake_nvml(*, fail_init=False, fail_sample=False, util=37, free=10 * GiB, total=80 * GiB):
    calls = {"init": 0, "shutdown": 0, "index": [], "uuid": []}

    class NVMLError(Exception):
        pass

    def init():
        calls["init"] += 1
        if fail_init:
            raise NVMLError("Driver Not Loaded")

    def by_index(i):
        calls["index"].append(i)
        return ("handle", i)

    def by_uuid(u):
        calls["uuid"].append(u)
        return ("handle", u)

    def utilization(handle):
        if fail_sample:
            raise NVMLError("Not Supported")
        return types.SimpleNamespace(gpu=util, memory=5)

    module = types.ModuleType("pynvml")
    module.nvmlInit = init
    module.nvmlShutdown = lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1)
    module.nvmlDeviceGetHandleByIndex = by_index
    module.nvmlDeviceGetHandleByUUID = by_uuid
    module.nvmlDeviceGetUtilizationRates = utilization
    module.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(free=free, total=total, used=total - free)
    return module, calls


def test_missing_nvml_library_means_no_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)   # makes `import pynvml` raise ImportError
    monitor = NvmlGpuMonitor.create()
    assert isinstance(monitor, NoGpu) and "nvidia-ml-py" in monitor.reason
    assert monitor.sample() is None
    monitor.close()


def test_nvml_without_driver_means_no_gpu(monkeypatch):
    module, calls = fake_nvml(fail_init=True)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monitor = NvmlGpuMonitor.create()
    assert isinstance(monitor, NoGpu) and "Driver Not Loaded" in monitor.reason
    assert monitor.sample() is None


def test_device_without_counters_means_no_gpu_and_releases_nvml(monkeypatch):
    module, calls = fake_nvml(fail_sample=True)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monitor = NvmlGpuMonitor.create()
    assert isinstance(monitor, NoGpu) and monitor.sample() is None
    assert calls["shutdown"] == calls["init"] == 1


def test_nvml_reading_is_a_fraction_and_bytes(monkeypatch):
    module, calls = fake_nvml(util=37, free=10 * GiB, total=80 * GiB)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monitor = NvmlGpuMonitor.create(0)
    assert isinstance(monitor, NvmlGpuMonitor) and isinstance(monitor, GpuMonitor)
    assert monitor.sample() == GpuReading(utilization=0.37, memory_free_bytes=10 * GiB, memory_total_bytes=80 * GiB)
    monitor.close()
    monitor.close()
    assert calls["shutdown"] == 1
    assert monitor.sample() is None


def test_a_failing_read_later_is_none_not_an_exception(monkeypatch):
    module, _ = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monitor = NvmlGpuMonitor.create()
    module.nvmlDeviceGetMemoryInfo = lambda h: (_ for _ in ()).throw(RuntimeError("GPU has fallen off the bus"))
    assert monitor.sample() is None


@pytest.mark.parametrize("visible, device, index, uuid", [
    ("3,1", 1, [1], []),
    ("GPU-8a1f, 2", 0, [], ["GPU-8a1f"]),
    (None, 2, [2], []),
])
def test_cuda_visible_devices_maps_the_ordinal_to_nvml(monkeypatch, visible, device, index, uuid):
    module, calls = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert isinstance(NvmlGpuMonitor.create(device), NvmlGpuMonitor)
    assert (calls["index"], calls["uuid"]) == (index, uuid)


def test_hidden_devices_mean_no_gpu(monkeypatch):
    module, _ = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert isinstance(NvmlGpuMonitor.create(), NoGpu)


def test_gpu_monitor_arguments_are_checked():
    with pytest.raises(ValueError, match="cuda_device"):
        NvmlGpuMonitor.create(-1)


def test_wait_monitor_means_with_a_fake_clock():
    clock = FakeClock()
    monitor = WaitMonitor(window=10, clock=clock)
    assert monitor.sample() == WaitReading(0.0, 0.0, 0, 0.0)
    for wait, step in [(0.010, 0.100), (0.030, 0.200), (0.020, 0.300)]:
        monitor.wait_started()
        clock.advance(wait)
        monitor.wait_ended()
        clock.advance(step)
    reading = monitor.sample()
    assert reading.batches == 3
    assert reading.mean_wait_s == pytest.approx(0.020, abs=1e-12)
    # The last step is not over until the next request, so two steps are known.
    assert reading.mean_step_s == pytest.approx(0.150, abs=1e-12)
    assert reading.stdev_wait_s == pytest.approx((2 * 0.01 ** 2 / 3) ** 0.5, abs=1e-12)


def test_wait_monitor_keeps_only_its_window():
    clock = FakeClock()
    monitor = WaitMonitor(window=4, clock=clock)
    for i in range(10):
        with monitor.waiting():
            clock.advance(0.001 * i)
        clock.advance(0.05)
    reading = monitor.sample()
    assert reading.batches == 4
    assert reading.mean_wait_s == pytest.approx(0.001 * (6 + 7 + 8 + 9) / 4, abs=1e-12)
    assert reading.mean_step_s == pytest.approx(0.05, abs=1e-12)


def test_wait_monitor_misuse_and_reset():
    clock = FakeClock()
    monitor = WaitMonitor(clock=clock)
    with pytest.raises(RuntimeError, match="without wait_started"):
        monitor.wait_ended()
    monitor.wait_started()
    with pytest.raises(RuntimeError, match="twice"):
        monitor.wait_started()
    monitor.wait_ended()
    clock.advance(60)   # an evaluation pass, say
    monitor.reset()
    with monitor.waiting():
        clock.advance(0.5)
    assert monitor.sample() == WaitReading(0.5, 0.0, 1, 0.0)


def test_a_failed_fetch_is_not_counted():
    clock = FakeClock()
    monitor = WaitMonitor(clock=clock)
    with pytest.raises(StopIteration):
        with monitor.waiting():
            clock.advance(1.0)
            raise StopIteration
    assert monitor.sample().batches == 0
    monitor.wait_started()   # the failed fetch left no wait open


def test_a_take_is_recorded_as_a_waiting_block_is():
    """``take(get)`` (the Loader's, per batch) and ``with waiting(): get()`` give the same records, also where the
    clock stepped back (a wait is never negative, nor a step); a failed take is not counted, nor the step after."""
    records = []
    for use_take in (False, True):
        times = iter([100.0, 101.0, 103.0, 102.5, 102.0, 104.0, 106.0, 106.5, 107.0, 108.0])
        monitor = WaitMonitor(clock=lambda: next(times))

        def get(fail=False):
            if fail:
                raise KeyError("no batch")
            return "batch"

        for fail in (False, False, False, True, False):
            with pytest.raises(KeyError) if fail else contextlib.nullcontext():
                if use_take:
                    assert monitor.take(lambda: get(fail)) == "batch"
                else:
                    with monitor.waiting():
                        get(fail)
        monitor.delivered(7)
        records.append(monitor.since(0))
    assert records[0] == records[1] == [(100.0, 101.0, None, None), (103.0, 103.0, 2.0, None),
                                        (102.0, 104.0, 0.0, None), (106.5, 107.0, None, 7)]
    monitor.wait_started()
    with pytest.raises(RuntimeError, match="take\\(\\) called between wait_started\\(\\) and wait_ended"):
        monitor.take(get)


def test_wait_monitor_arguments_are_checked():
    with pytest.raises(ValueError, match="window"):
        WaitMonitor(window=0)
    with pytest.raises(TypeError, match="clock"):
        WaitMonitor(clock=1.0)


def test_cpu_monitor_readings_are_in_range():
    monitor = PsutilCpuMonitor()
    assert isinstance(monitor, CpuMonitor)
    total = 0
    for i in range(300_000):   # some work so the process shows up
        total += i * i
    reading = monitor.sample()
    assert reading.cores >= 1
    assert 0.0 <= reading.process_percent <= 100.0
    assert 0.0 <= reading.machine_percent <= 100.0
    assert 0.0 <= reading.process_cores_busy <= reading.cores
    with pytest.raises(ValueError, match="pid"):
        PsutilCpuMonitor(pid=0)


def test_readings_reject_impossible_values():
    with pytest.raises(ValueError, match="utilization"):
        GpuReading(1.5, 1, 2)
    with pytest.raises(ValueError, match="memory_free_bytes"):
        GpuReading(0.5, 3, 2)
    with pytest.raises(ValueError, match="process_percent"):
        CpuReading(120.0, 50.0, 4)
    with pytest.raises(ValueError, match="cores"):
        CpuReading(10.0, 50.0, 0)
    with pytest.raises(ValueError, match="mean_wait_s"):
        WaitReading(-1.0, 0.0, 0)


def test_scripted_monitor_plays_its_readings_then_repeats_the_last():
    readings = [GpuReading(0.1, 5, 10), None]
    monitor = ScriptedMonitor(readings)
    assert isinstance(monitor, GpuMonitor)
    assert [monitor.sample() for _ in range(4)] == [readings[0], None, None, None]
    with pytest.raises(ValueError, match="readings"):
        ScriptedMonitor([])
