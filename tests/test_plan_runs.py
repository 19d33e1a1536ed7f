"""PlanRuns: consecutive plans of one key come as one run, a plan of key None as a run of its own, and the plan
read past a run's end is neither lost nor repeated (by the next run, or by rest())."""
from __future__ import annotations

from feedline.loader.runners.plan_runs import PlanRuns

PLANS = [("a", 1), ("a", 2), (None, 3), (None, 4), ("b", 5), ("a", 6), ("a", 7)]


def test_runs_by_key_and_none_alone():
    runs = PlanRuns(iter(PLANS), key=lambda plan: plan[0])
    got = []
    while run := runs.next_run():
        got.append([n for _, n in run])
    assert got == [[1, 2], [3], [4], [5], [6, 7]]
    assert runs.next_run() == [] and list(runs.rest()) == []


def test_the_rest_starts_with_the_plan_read_past_the_run():
    runs = PlanRuns(iter(PLANS), key=lambda plan: plan[0])
    assert [n for _, n in runs.next_run()] == [1, 2]
    assert [n for _, n in runs.next_run()] == [3]  # a None run reads nothing past itself
    assert [n for _, n in runs.rest()] == [4, 5, 6, 7]
