"""What the scheduler measures while a pipeline runs: CPU load, GPU load and memory, and how long the
trainer waits for each batch. Each is a small interface with a real implementation and a scripted one
for tests; nothing here raises because a machine lacks a GPU or a driver.
"""
from __future__ import annotations

import math
import os
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Generic, Iterable, Iterator, Protocol, TypeVar, runtime_checkable

import psutil

from ...pipelines.validate import finite_at_least, int_at_least, int_in, optional_positive_int, positive_int


@dataclass(frozen=True)
class CpuReading:
    """``process_percent`` and ``machine_percent`` are shares of all ``cores`` (0 to 100)."""

    process_percent: float
    machine_percent: float
    cores: int

    def __post_init__(self) -> None:
        positive_int("cores", self.cores)
        for name in ("process_percent", "machine_percent"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 <= value <= 100.0):
                raise ValueError(f"{name} must be a percentage in [0, 100], got {value!r}")

    @property
    def process_cores_busy(self) -> float:
        return self.process_percent / 100.0 * self.cores


@dataclass(frozen=True)
class GpuReading:
    """``utilization`` is the fraction of recent time (0 to 1) in which the GPU ran any kernel."""

    utilization: float
    memory_free_bytes: int
    memory_total_bytes: int

    def __post_init__(self) -> None:
        if not (isinstance(self.utilization, (int, float)) and 0.0 <= self.utilization <= 1.0):
            raise ValueError(f"utilization must be a fraction in [0, 1], got {self.utilization!r}")
        positive_int("memory_total_bytes", self.memory_total_bytes)
        int_in("memory_free_bytes", self.memory_free_bytes, 0, self.memory_total_bytes)


@dataclass(frozen=True)
class WaitReading:
    """Over the last ``batches`` batches: how long the trainer waited for each, and how long it worked on
    each before asking for the next (its step). Means are 0.0 until something was measured."""

    mean_wait_s: float
    mean_step_s: float
    batches: int
    stdev_wait_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("mean_wait_s", "mean_step_s", "stdev_wait_s"):
            finite_at_least(name, getattr(self, name), 0)
        int_at_least("batches", self.batches, 0)


@runtime_checkable
class CpuMonitor(Protocol):
    def sample(self) -> CpuReading: ...


@runtime_checkable
class GpuMonitor(Protocol):
    def sample(self) -> GpuReading | None: ...


def _usable_cores(process: psutil.Process) -> int:
    try:
        return max(1, len(process.cpu_affinity()))
    except (AttributeError, psutil.Error, OSError):  # no affinity API on macOS
        return psutil.cpu_count() or 1


class PsutilCpuMonitor:
    """This process's CPU use and the machine's, each since the previous ``sample()`` (or construction)."""

    def __init__(self, pid: int | None = None):
        pid = optional_positive_int("pid", pid)
        self._process = psutil.Process(pid)
        self.cores = _usable_cores(self._process)
        # psutil measures from the previous call; these first calls only start the interval.
        self._process.cpu_percent(None)
        psutil.cpu_percent(None)

    def sample(self) -> CpuReading:
        per_core_sum = self._process.cpu_percent(None)   # 100 per fully busy core
        machine = psutil.cpu_percent(None)
        return CpuReading(process_percent=min(100.0, max(0.0, per_core_sum / self.cores)),
                          machine_percent=min(100.0, max(0.0, float(machine))), cores=self.cores)


class NoGpu:
    """The GPU monitor of a machine without a usable GPU; ``reason`` says why."""

    def __init__(self, reason: str = "no GPU"):
        self.reason = reason

    def sample(self) -> None:
        return None

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"NoGpu({self.reason!r})"


def _nvml_handle(nvml, cuda_device: int):
    """The NVML handle of CUDA device ``cuda_device`` as this process numbers it: NVML ignores
    CUDA_VISIBLE_DEVICES, so the ordinal is mapped through it."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return nvml.nvmlDeviceGetHandleByIndex(cuda_device)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if cuda_device >= len(entries):
        raise LookupError(f"CUDA_VISIBLE_DEVICES={visible!r} shows no device {cuda_device}")
    entry = entries[cuda_device]
    if entry.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(entry))
    return nvml.nvmlDeviceGetHandleByUUID(entry)


class NvmlGpuMonitor:
    """Utilisation and free memory of one GPU through NVML. Build it with ``create()``, which returns
    ``NoGpu`` where NVML, its driver or the device is missing."""

    def __init__(self, nvml, handle):
        self._nvml = nvml
        self._handle = handle
        self._open = True

    @classmethod
    def create(cls, cuda_device: int = 0) -> NvmlGpuMonitor | NoGpu:
        cuda_device = int_at_least("cuda_device", cuda_device, 0)
        try:
            import pynvml
        except Exception as exc:  # ImportError, or a broken install
            return NoGpu(f"nvidia-ml-py is not usable: {exc}")
        try:
            pynvml.nvmlInit()
        except Exception as exc:
            return NoGpu(f"NVML cannot start (no NVIDIA driver?): {exc}")
        try:
            handle = _nvml_handle(pynvml, cuda_device)
            monitor = cls(pynvml, handle)
            if monitor.sample() is None:
                raise RuntimeError("NVML reports no utilisation or memory for it")
        except Exception as exc:
            _shutdown(pynvml)
            return NoGpu(f"CUDA device {cuda_device}: {exc}")
        return monitor

    def sample(self) -> GpuReading | None:
        if not self._open:
            return None
        try:
            rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            memory = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
            total = int(memory.total)
            return GpuReading(utilization=min(1.0, max(0.0, rates.gpu / 100.0)),
                              memory_free_bytes=min(total, max(0, int(memory.free))), memory_total_bytes=total)
        except Exception:  # a GPU that fell off the bus, or a MIG slice without utilisation counters
            return None

    def close(self) -> None:
        if self._open:
            self._open = False
            _shutdown(self._nvml)


def _shutdown(nvml) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:
        pass


T = TypeVar("T")


class ScriptedMonitor(Generic[T]):
    """A fake CPU or GPU monitor: ``sample()`` returns the given readings in order, then repeats the last."""

    def __init__(self, readings: Iterable[T]):
        self._readings = list(readings)
        if not self._readings:
            raise ValueError("readings must hold at least one reading (None stands for 'no GPU')")
        self._next = 0

    def sample(self) -> T:
        reading = self._readings[min(self._next, len(self._readings) - 1)]
        self._next += 1
        return reading


class WaitMonitor:
    """The one clock of the trainer's waits: when it asked for each batch, when it got it, how long it worked
    before asking (its step) and, where the Loader says so, how many samples the batch delivered. The scheduler
    reads the last ``window`` batches (``sample``), the Loader's live figures (``stats.DeliveryMeter``) the last
    ``kept`` ones, each from a mark of its own, so neither's reset moves the other's window.

    The loader calls ``wait_started()`` when the trainer asks for a batch and ``wait_ended()`` when it hands
    the batch over (or ``with monitor.waiting(): ...``), then ``delivered(samples)``; the time from handing a
    batch over to the next request is the trainer's step. Call ``reset()`` across pauses (an epoch's evaluation,
    a re-plan) so a pause is not read as a long step and the scheduler's window starts anew.
    """

    def __init__(self, window: int = 64, clock: Callable[[], float] = time.perf_counter, kept: int = 256):
        self.window = positive_int("window", window)
        if not callable(clock):
            raise TypeError(f"clock must be callable (e.g. time.perf_counter), got {type(clock).__name__}")
        self._clock = clock
        self.kept = max(positive_int("kept", kept), self.window)
        # per batch, as the clock read it: [asked, got, handed over before (None: not known), samples delivered
        # (None: not said)]; ``since`` makes the step and clamps (not each batch, on the trainer's thread)
        self._batches: deque[list] = deque(maxlen=self.kept)
        self.count = 0         # batches timed so far: readers mark where their window starts by it
        self._mark = 0         # where the scheduler's window starts
        self._waiting_since: float | None = None
        self._handed_over_at: float | None = None

    def wait_started(self) -> None:
        if self._waiting_since is not None:
            raise RuntimeError("wait_started() called twice without wait_ended() in between")
        self._waiting_since = self._clock()

    def wait_ended(self) -> None:
        if self._waiting_since is None:
            raise RuntimeError("wait_ended() called without wait_started()")
        now = self._clock()
        self._batches.append([self._waiting_since, now, self._handed_over_at, None])
        self.count += 1
        self._waiting_since = None
        self._handed_over_at = now

    def take(self, get: Callable[[], T]) -> T:
        """``get()`` timed as ``with monitor.waiting(): get()`` times it, in one call (the Loader's ``next()``, per
        batch on the trainer's thread)."""
        if self._waiting_since is not None:
            raise RuntimeError("take() called between wait_started() and wait_ended()")
        asked = self._clock()
        try:
            got = get()
        except BaseException:
            self._handed_over_at = None
            raise
        now = self._clock()
        self._batches.append([asked, now, self._handed_over_at, None])
        self.count += 1
        self._handed_over_at = now
        return got

    def wait_failed(self) -> None:
        """The fetch since ``wait_started()`` failed: not counted (nor the step before the next one)."""
        self._waiting_since = None
        self._handed_over_at = None

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """``with monitor.waiting(): batch = next(stream)``; a failed fetch is not counted."""
        self.wait_started()
        try:
            yield
        except BaseException:
            self.wait_failed()
            raise
        self.wait_ended()

    def delivered(self, samples: int) -> None:
        """The batch last handed over delivered ``samples`` samples to the trainer."""
        if self._batches:
            self._batches[-1][3] = samples

    def reset(self) -> None:
        self._mark = self.count
        self._waiting_since = None
        self._handed_over_at = None

    def since(self, mark: int) -> list[tuple[float, float, float | None, int | None]]:
        """``(asked, got, step before, samples)`` of each batch timed from the ``mark``-th on, as far back as
        it keeps them."""
        kept = list(self._batches)
        return [(asked, max(got, asked), None if before is None else max(0.0, asked - before), samples)
                for asked, got, before, samples in kept[max(0, len(kept) - (self.count - mark)):]]

    def sample(self) -> WaitReading:
        batches = self.since(self._mark)[-self.window:]
        waits = [got - asked for asked, got, _, _ in batches]
        steps = [step for _, _, step, _ in batches if step is not None]
        mean_wait = sum(waits) / len(waits) if waits else 0.0
        stdev = math.sqrt(sum((w - mean_wait) ** 2 for w in waits) / len(waits)) if waits else 0.0
        return WaitReading(mean_wait_s=mean_wait, mean_step_s=sum(steps) / len(steps) if steps else 0.0,
                           batches=len(waits), stdev_wait_s=stdev)
