"""Measuring contenders (placements, thread counts) in alternating rounds until their medians hold still, and
telling which is faster beyond the noise.

Each round measures every contender once, in the same order, so that a slow stretch of a busy machine falls
on all of them. After ``min_rounds`` the rounds stop as soon as every contender's median is stable: its relative
standard error (1.2533 x the rounds' standard deviation / sqrt(rounds), over the median) is at most
``tolerance``; otherwise at ``max_rounds``, with ``stable`` False. Pure: the measuring is a function given in.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Hashable, Mapping, Sequence

from ...pipelines.validate import finite_at_least, int_at_least

MEDIAN_SE = 1.2533      # standard error of a median over that of a mean, for normal noise
NOISE_SIGMAS = 2.0      # a difference must clear this many standard errors of the two medians together


def relative_spread(values: Sequence[float]) -> float:
    """The relative standard error of the median of ``values`` (infinite with fewer than two)."""
    if len(values) < 2:
        return math.inf
    median = statistics.median(values)
    if median <= 0:
        return math.inf
    return MEDIAN_SE * statistics.stdev(values) / math.sqrt(len(values)) / median


@dataclass(frozen=True)
class Rounds:
    """Each contender's measured rates, round by round."""

    rates: Mapping[Hashable, tuple[float, ...]]
    tolerance: float
    stable: bool

    @property
    def rounds(self) -> int:
        return min(len(r) for r in self.rates.values())

    @property
    def medians(self) -> dict:
        return {k: statistics.median(r) for k, r in self.rates.items()}

    @property
    def spreads(self) -> dict:
        """Each median's relative standard error."""
        return {k: relative_spread(r) for k, r in self.rates.items()}

    def beats(self, a: Hashable, b: Hashable, margin: float = 0.0) -> bool:
        """Whether ``a``'s median exceeds ``b``'s by more than ``margin`` and by more than the noise
        (NOISE_SIGMAS standard errors of the two medians together)."""
        spreads = self.spreads
        noise = NOISE_SIGMAS * math.hypot(spreads[a], spreads[b])
        medians = self.medians
        return medians[a] > medians[b] * (1.0 + max(margin, noise))

    def best(self, default: Hashable, margin: float = 0.0) -> Hashable:
        """The contender with the highest median if it beats ``default`` beyond the noise, else ``default``."""
        medians = self.medians
        top = max(medians, key=medians.get)
        return top if top != default and self.beats(top, default, margin) else default

    def report(self) -> dict:
        """JSON-ready: rounds, stable, and per contender (its name as text) the median, spread and rates."""
        spreads = self.spreads
        return {"rounds": self.rounds, "stable": self.stable, "tolerance": self.tolerance,
                "contenders": {str(k): {"median": statistics.median(r),
                                        "spread": spreads[k] if math.isfinite(spreads[k]) else None,
                                        "rates": list(r)} for k, r in self.rates.items()}}


def measure_rounds(contenders: Sequence[Hashable], measure: Callable[[Hashable], float], *, min_rounds: int = 3,
                   max_rounds: int = 10, tolerance: float = 0.02) -> Rounds:
    """Alternating rounds of ``measure(contender)`` (a rate: higher is better) until every median is stable
    within ``tolerance`` (after at least ``min_rounds``) or ``max_rounds`` are done."""
    if not contenders:
        raise ValueError("contenders must name at least one contender, got none")
    min_rounds = int_at_least("min_rounds", min_rounds, 2)
    max_rounds = int_at_least("max_rounds", max_rounds, min_rounds)
    tolerance = finite_at_least("tolerance", tolerance, 0.0)
    rates: dict[Hashable, list[float]] = {c: [] for c in contenders}
    for done in range(1, max_rounds + 1):
        for c in contenders:
            rates[c].append(float(measure(c)))
        if done >= min_rounds and all(relative_spread(r) <= tolerance for r in rates.values()):
            return Rounds({k: tuple(v) for k, v in rates.items()}, tolerance, True)
    return Rounds({k: tuple(v) for k, v in rates.items()}, tolerance, False)
