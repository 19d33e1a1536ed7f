"""Choosing the cut (which stages run on the GPU), the CPU thread count and the prefetch depth, once and then
online as the measurements move.

Pure and deterministic: every input arrives as ``Measurements`` and time only through the injected clock,
so tests drive it with synthetic readings. What each candidate is predicted to give is ``model``'s; this
module decides when a better prediction is worth a move.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

from ...pipelines.spec import PipelineSpec
from ...pipelines.stage import Backend, Stage
from ...pipelines.validate import finite_at_least, int_at_least
from ..errors import PlacementError
from .decision import Move, PlacementDecision
from .measurements import Measurements
from .model import PlacementModel

NOISE_SIGMAS = 4.0            # how many standard errors of noise a move's mean gain must clear
NOISE_WINDOW_CONFIRMS = 16    # noise is estimated over this many times `confirm` updates
STABLE_WINDOW_CONFIRMS = 4    # a plan moved to must have been able to run for this many times `confirm`


@dataclass(frozen=True)
class _Record:
    """What one update saw; the last NOISE_WINDOW_CONFIRMS x confirm of them are kept."""

    scores: Mapping[tuple[int, int], float]   # of the candidates that can run
    fractions: tuple[float, ...]
    logs: tuple[float, ...]
    measured: float | None
    trainer_cycle_s: float | None


def _robust_noise(values: Sequence[float]) -> float:
    """Standard deviation of the update-to-update noise in ``values``, from their successive differences
    (so a slow drift is not noise) with each difference capped at four times the median one (so a step
    change in conditions is not noise either)."""
    finite = [v for v in values if math.isfinite(v)]
    diffs = [abs(b - a) for a, b in zip(finite, finite[1:])]
    if len(diffs) < 2:
        return 0.0
    cap = 4.0 * 1.4826 * statistics.median(diffs)
    return math.sqrt(statistics.fmean(min(d, cap) ** 2 for d in diffs) / 2.0)


def _ratio(record: _Record, key: tuple[int, int], current: tuple[int, int]) -> float:
    """How much better ``key`` scored than the current plan; infinite where the current plan could not run."""
    base = record.scores.get(current, 0.0)
    return record.scores[key] / base if base > 0 else math.inf


def _log(x: float, floor: float = 1e-12) -> float:
    return math.log(max(x, floor))


class Scheduler:
    """``decide()`` gives the best placement decision for one set of measurements; ``update()`` re-plans online.

    ``update()`` moves to another plan only when all of these hold:
      * at least ``confirm`` updates and ``min_interval_s`` have passed since the last move;
      * the other plan could run at every one of the last STABLE_WINDOW_CONFIRMS x ``confirm`` updates;
      * its predicted gain over the current plan beat ``deadband`` at each of the last ``confirm``
        updates, and its mean (log) gain over them beat the deadband by NOISE_SIGMAS standard errors of
        the measured noise: the update-to-update scatter of that gain, of the measured throughput and
        of the trainer's time per batch, whichever is largest;
      * if it was left within the last ``recent_intervals`` x ``min_interval_s``, conditions (resources,
        costs, the trainer's demand; medians over the last ``confirm`` updates) have since moved by
        more than the deadband.
    A current plan that can no longer run (GPU saturated, memory gone) counts as an infinite gain.
    """

    def __init__(self, pipeline: PipelineSpec | Sequence[Stage], valid_cuts: Sequence[int] | None = None, *,
                 batch_size: int, output_device: Backend | str = Backend.CPU, deadband: float = 0.10,
                 min_interval_s: float = 60.0, confirm: int = 5, recent_intervals: int = 10,
                 max_threads: int | None = None, gpu_memory_reserve_bytes: float = 512 * 2 ** 20,
                 clock: Callable[[], float] = time.monotonic):
        self.model = PlacementModel(pipeline, valid_cuts, batch_size=batch_size, output_device=output_device,
                                    max_threads=max_threads, gpu_memory_reserve_bytes=gpu_memory_reserve_bytes)
        self.deadband = finite_at_least("deadband", deadband, 0.0)
        if not 0.10 <= self.deadband < 1.0:
            raise ValueError(f"deadband must be in [0.10, 1): gains under 10% are measurement noise, got {deadband!r}")
        self.min_interval_s = finite_at_least("min_interval_s", min_interval_s, 0.0)
        self.confirm = int_at_least("confirm", confirm, 1)
        self.recent_intervals = int_at_least("recent_intervals", recent_intervals, 0)
        if not callable(clock):
            raise TypeError(f"clock must be callable (e.g. time.monotonic), got {type(clock).__name__}")
        self._clock = clock
        self.current: PlacementDecision | None = None
        self.history: list[Move] = []
        self._records: list[_Record] = []   # the last NOISE_WINDOW_CONFIRMS x confirm updates
        self._since_move = 0
        self._last_move_at: float | None = None
        self._left: dict[tuple[int, int], tuple[float, tuple[float, ...], tuple[float, ...]]] = {}

    # ---- what it places ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.model.name

    @property
    def stages(self) -> tuple[Stage, ...]:
        return self.model.stages

    @property
    def valid_cuts(self) -> tuple[int, ...]:
        return self.model.valid_cuts

    @property
    def batch_size(self) -> int:
        return self.model.batch_size

    @property
    def output_device(self) -> Backend:
        return self.model.output_device

    @property
    def max_threads(self) -> int | None:
        """The most CPU threads a decision may take (None: one per core)."""
        return self.model.max_threads

    @max_threads.setter
    def max_threads(self, value: int | None) -> None:
        self.model.max_threads = None if value is None else int_at_least("max_threads", value, 1)

    def describe_cut(self, cut: int) -> str:
        return self.model.describe_cut(cut)

    # ---- deciding ----------------------------------------------------------------------------------
    def decide(self, measurements: Measurements) -> PlacementDecision:
        """The best decision for these measurements; changes no state."""
        candidates = self.model.candidates(measurements)
        best = self.model.best(candidates)
        if best is None:
            why = sorted({f"{self.describe_cut(c.cut)}: {c.why_not}" for c in candidates})
            raise PlacementError(f"no placement of {self.name} can run here: " + "; ".join(why))
        return self.model.explain(best, candidates, measurements)

    def adopt(self, cut: int, threads: int, measurements: Measurements,
              reason: str = "set by the caller") -> PlacementDecision:
        """Make (cut, threads) the current decision without the deadband rules, e.g. the Loader's starting one."""
        if cut not in self.valid_cuts:
            raise ValueError(f"cut must be one of {list(self.valid_cuts)}, got {cut!r}")
        int_at_least("threads", threads, 1)
        candidate = self.model.one(cut, threads, measurements)
        if candidate.prediction is None:
            raise ValueError(f"cut {cut} cannot be predicted: {candidate.why_not}")
        decision = self.model.explain(candidate, self.model.candidates(measurements), measurements)
        self._move(decision, reason)
        return decision

    def update(self, measurements: Measurements) -> PlacementDecision | None:
        """Feed one set of measurements; returns the new decision when it is time to move, else None.
        The first call adopts ``decide()``'s decision and returns it."""
        if self.current is None:
            decision = self.decide(measurements)
            self._move(decision, "initial plan")
            return decision
        now = self._clock()
        candidates = self.model.candidates(measurements)
        here = self.current.key
        scores = {c.key: c.score for c in candidates if c.why_not is None}
        if here not in {c.key for c in candidates}:   # more threads than this machine now has cores
            current = self.model.one(self.current.cut, self.current.threads, measurements)
            if current.why_not is None:
                scores[here] = current.score
        self._records.append(self._record(scores, measurements))
        del self._records[:-NOISE_WINDOW_CONFIRMS * self.confirm]
        self._since_move += 1
        if self._since_move < self.confirm or now - self._last_move_at < self.min_interval_s:
            return None
        window = self._records[-self.confirm:]
        # A plan that could not run at some recent update (a GPU hovering near saturation, free memory
        # near the need) is not moved to until it has run for the whole stability window.
        stable = self._records[-STABLE_WINDOW_CONFIRMS * self.confirm:]
        steady = set(window[-1].scores).intersection(*(r.scores.keys() for r in stable)) - {here}
        if not steady:
            return None
        worst = {k: min(_ratio(r, k, here) for r in window) for k in steady}
        target = max(steady, key=lambda k: (worst[k], sum(r.scores[k] for r in window), k[0], -k[1]))
        mean_log_gain = statistics.fmean(math.log(_ratio(r, target, here)) for r in window)
        noise = max(_robust_noise([math.log(_ratio(r, target, here)) for r in self._records
                                   if target in r.scores and here in r.scores]),
                    _robust_noise([_log(r.measured) for r in self._records if r.measured]),
                    _robust_noise([_log(r.trainer_cycle_s) for r in self._records if r.trainer_cycle_s]))
        required = math.log1p(self.deadband) + NOISE_SIGMAS * noise / math.sqrt(self.confirm)
        if worst[target] <= 1.0 + self.deadband or mean_log_gain <= required:
            return None
        fractions, logs = self._median_conditions(window)
        left = self._left.get(target)
        if left is not None and now - left[0] < self.recent_intervals * self.min_interval_s \
                and not self._changed(left[1], left[2], fractions, logs):
            return None
        decision = self.model.explain(next(c for c in candidates if c.key == target), candidates, measurements)
        gain = "the current plan cannot run" if math.isinf(mean_log_gain) else \
            f"mean predicted gain +{math.expm1(mean_log_gain):.0%} (needed +{math.expm1(required):.0%})"
        self._left[here] = (now, fractions, logs)
        self._move(decision, f"{gain} over the last {self.confirm} updates; {decision.reason}")
        return decision

    def _move(self, decision: PlacementDecision, reason: str) -> None:
        now = self._clock()
        self.history.append(Move(now, self.current, decision, reason))
        self.current = decision
        self._last_move_at = now
        self._since_move = 0

    # ---- conditions, for noise and for "changed since we left" -------------------------------------
    def _record(self, scores: Mapping[tuple[int, int], float], m: Measurements) -> _Record:
        res, costs = m.resources, self.model.ordered_costs(m)
        gpu = res.gpu
        fractions = (min(res.trainer_cpu_cores_busy / res.cores, 1.0),
                     res.trainer_gpu_busy_fraction if gpu else 1.0, 1.0 if gpu else 0.0)
        demand = m.demand_samples_per_s(self.batch_size)
        logs = (_log(gpu.memory_free_bytes + res.gpu_memory_held_bytes, 1.0) if gpu else 0.0,
                _log(res.h2d_bytes_per_s), _log(res.d2h_bytes_per_s or res.h2d_bytes_per_s),
                _log(demand) if demand else math.nan, _log(m.source_bytes_per_sample, 1.0),
                *(_log(x) if x is not None else math.nan
                  for c in costs for x in (c.cpu_s_per_sample, c.gpu_s_per_sample)),
                *(_log(c.bytes_out_per_sample, 1.0) for c in costs))
        cycle = (m.wait.mean_wait_s + m.wait.mean_step_s) if m.wait and m.wait.batches else None
        return _Record(MappingProxyType(dict(scores)), fractions, logs, m.samples_per_s, cycle)

    @staticmethod
    def _median_conditions(window: Sequence[_Record]) -> tuple[tuple[float, ...], tuple[float, ...]]:
        def med(values):
            finite = [v for v in values if not math.isnan(v)]
            return statistics.median(finite) if finite else math.nan
        return (tuple(med(col) for col in zip(*(r.fractions for r in window))),
                tuple(med(col) for col in zip(*(r.logs for r in window))))

    def _changed(self, fractions_then, logs_then, fractions_now, logs_now) -> bool:
        if any(abs(a - b) > self.deadband for a, b in zip(fractions_then, fractions_now)):
            return True
        limit = math.log1p(self.deadband)
        return any(abs(a - b) > limit for a, b in zip(logs_then, logs_now)
                   if not (math.isnan(a) or math.isnan(b)))
