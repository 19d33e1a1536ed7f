"""Plans taken a run at a time: consecutive plans of one key (an epoch's, a group's), the plan read past a run's
end kept for the next run."""
from __future__ import annotations

import itertools
from typing import Callable, Hashable, Iterator

from ..sampler import BatchPlan


class PlanRuns:
    """``plans`` in runs of consecutive plans with one ``key(plan)``; a plan whose key is None is a run of its
    own."""

    def __init__(self, plans: Iterator[BatchPlan], key: Callable[[BatchPlan], Hashable | None]):
        self._plans = iter(plans)
        self._key = key
        self._next: BatchPlan | None = None  # read past the end of the last run

    def next_run(self) -> list[BatchPlan]:
        """The next run (empty once the plans are over)."""
        first = self._next if self._next is not None else next(self._plans, None)
        self._next = None
        if first is None:
            return []
        run, key = [first], self._key(first)
        if key is None:
            return run
        for plan in self._plans:
            if self._key(plan) != key:
                self._next = plan
                break
            run.append(plan)
        return run

    def rest(self) -> Iterator[BatchPlan]:
        """The plans not yet taken in runs, one by one."""
        head = [self._next] if self._next is not None else []
        self._next = None
        return itertools.chain(head, self._plans)
