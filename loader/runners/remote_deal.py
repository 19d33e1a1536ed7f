"""How a ``RemoteRunner`` deals its plans between the local runner and the Ray workers, in groups.

A group goes whole to one side: one plan of images, or every plan of a table's group of consecutive shuffle
buffer-fulls (``remote.BUFFERS_PER_GROUP``), so that a worker reads and parses only the chunks of the buffer-fulls
it makes. Which side, group by group: the local side takes the share of groups that keeps both sides busy
(``balanced_rates``), from what each side was measured to cost per batch (``DealCosts``): a table's local groups
are made on a thread of their own and timed there; a worker's group is timed from when the worker could start it
(sent, and its previous group done) to when it was done, as seen on this side (making, putting the results into
Ray's object store and fetching them). Until both sides are measured (images: the local side is not), the share is
the local threads' share of all the cores. Each side has at most a few groups to make at once (past that, the group
goes to a side with room; the groups made and not yet delivered are bounded by the runner's window), and the
workers always get ``MIN_REMOTE_SHARE`` of the groups, so that their cost keeps being measured.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..sampler import BatchPlan
from .plan_runs import PlanRuns

MIN_REMOTE_SHARE = 0.05  # of the groups, sent to workers however slow they were measured
_SAMPLES = 8  # groups each side's cost is taken over


def balanced_rates(local_threads: int, local_s: float, receive_s: float, worker_rates: list[float]
                   ) -> tuple[float, float]:
    """Batches per second made locally and remotely when both sides are kept busy: the workers make up to
    ``sum(worker_rates)`` (batches/s), each of their batches costing the ``local_threads`` local cores
    ``receive_s`` seconds to receive; the local cores make batches of ``local_s`` seconds each (all threads
    at work) in the time receiving leaves them. Receiving a batch costs less than making one, so the workers
    get all they can make, up to what the local cores can receive."""
    remote = sum(worker_rates)
    if receive_s > 0:
        remote = min(remote, local_threads / receive_s)
    local = max(0.0, 1.0 - remote * receive_s / local_threads) / local_s
    return local, remote


class DealCosts:
    """What each side of the deal was measured to cost per batch, over its last groups, and the local share
    that balances them."""

    def __init__(self, local_threads: int, workers: int, cpus_per_worker: int):
        self.local_threads = local_threads
        self.default_share = local_threads / (local_threads + workers * cpus_per_worker)
        self._local: deque[tuple[int, float]] = deque(maxlen=_SAMPLES)  # (batches, seconds) per group
        self._worker = [deque(maxlen=_SAMPLES) for _ in range(workers)]
        self._done = [0.0] * workers  # when each worker's last group was done
        self.receive_s = 0.0

    def local_group(self, batches: int, seconds: float) -> None:
        """The local runner made a group of ``batches`` in ``seconds``, working all that time."""
        self._local.append((batches, seconds))

    def worker_group(self, worker: int, batches: int, sent: float, done: float) -> None:
        """A group of ``batches`` sent to ``worker`` at ``sent`` was done at ``done`` (``time.perf_counter``):
        the worker spent the time since then, or since its previous group was done if that is later, on it (a
        worker makes its groups in the order they were sent)."""
        self._worker[worker].append((batches, done - max(sent, self._done[worker])))
        self._done[worker] = max(done, self._done[worker])

    def received(self, seconds: float) -> None:
        """Taking one remote batch out of the object store took ``seconds`` on this side."""
        self.receive_s = seconds if not self.receive_s else 0.9 * self.receive_s + 0.1 * seconds

    @staticmethod
    def _per_batch(samples) -> float | None:
        return sum(s for _, s in samples) / sum(b for b, _ in samples) if samples else None

    @property
    def local_s(self) -> float | None:
        """Seconds per batch of the local runner (all its threads together)."""
        return self._per_batch(self._local)

    @property
    def worker_s(self) -> list[float | None]:
        """Seconds per batch of each worker."""
        return [self._per_batch(d) for d in self._worker]

    def share(self) -> float:
        """The share of groups to make locally: the balanced one once both sides are measured."""
        local_s, worker_s = self.local_s, self.worker_s
        if local_s is None or any(s is None for s in worker_s):
            return self.default_share
        local, remote = balanced_rates(self.local_threads, local_s, self.receive_s,
                                       [1.0 / max(s, 1e-9) for s in worker_s])
        return min(local / (local + remote), 1.0 - MIN_REMOTE_SHARE)


@dataclass(eq=False)
class Job:
    """A group of plans sent to a worker (``worker``: its place in the runner's team): the task's result
    (``ref``) and a ``concurrent.futures.Future`` of it (``future``), which notes when it was done; once taken,
    its results, each let go of as its batch is delivered."""

    plans: tuple[BatchPlan, ...]
    worker: int
    ref: Any
    future: Any
    sent: float
    done: float | None = None
    results: list | None = None
    rest: Job | None = None  # the plans from ``rest_from`` on, sent again where the group stopped at an error
    rest_from: int = 0


class Deal:
    """Deals the plans out a group at a time, lazily: ``order`` holds, for each plan dealt, ``(job, k)``: its
    place in a group sent to a worker (``send(worker, plans)``'s job) or kept locally (``keep(plans)``'s job);
    where nothing keeps local groups, None, and ``local_plans()`` feeds those plans to a local runner, dealing
    further when it asks ahead of what was dealt.

    ``group_of(plan)``: consecutive plans with one key form a group (None: a group of its own). ``share()``:
    the share of groups to make locally. ``unfinished[w]``: groups worker ``w`` may have to make at once (sent,
    not yet ``done``); ``local_unfinished``, the local side (kept, not yet ``finished``). Groups made and not yet
    delivered are bounded by the runner's window, not here. ``runs``: consecutive groups dealt to one side at
    a time."""

    def __init__(self, plans: Iterator[BatchPlan], group_of: Callable, share: Callable[[], float],
                 send: Callable, unfinished: list[int], *, keep: Callable | None = None,
                 local_unfinished: int | None = None, runs: int = 1):
        self.plans = PlanRuns(plans, group_of)  # groups: runs of one key
        self.share = share
        self.send = send
        self.keep = keep
        self.caps = [cap * runs for cap in unfinished]
        self.local_cap = None if local_unfinished is None else local_unfinished * runs
        self.runs = runs
        self._working: list[deque] = [deque() for _ in unfinished]  # each side's jobs not yet seen done
        self._last_dealt = [-1] * len(unfinished)  # the group each worker was last dealt
        self._groups = 0
        self._working_local: deque = deque()
        self.order: deque = deque()
        self.local: deque[BatchPlan] = deque()
        self._credit: float | None = None  # local runs owed by the share (error diffusion)
        self._run: tuple[int | None, int] = (None, 0)  # the side of the current run, and groups left in it

    def working(self, side: int | None) -> int:
        """Groups that ``side`` (None: local) was dealt and has not finished."""
        jobs = self._working_local if side is None else self._working[side]
        while jobs and (jobs[0].finished if side is None else jobs[0].done is not None):
            jobs.popleft()
        return sum(1 for job in jobs if not (job.finished if side is None else job.done is not None))

    def _has_room(self, side: int | None) -> bool:
        if side is None:
            return self.local_cap is None or self.working(None) < self.local_cap
        return self.working(side) < self.caps[side]

    def _side(self) -> int | None:
        """Who makes the next group: None (locally) or a worker's place. Runs of groups are dealt in the share
        by error diffusion (the first run locally), so that the share may change from run to run; a side
        without room passes its turn to one with room (the local side, when no side has)."""
        side, left = self._run
        if left > 0 and self._has_room(side):
            self._run = (side, left - 1)
            return side
        room = [w for w in range(len(self.caps)) if self._has_room(w)]
        share = self.share()
        self._credit = (1.0 - share if self._credit is None else self._credit) + share
        local = not room or (self._credit >= 1.0 - 1e-9 and self._has_room(None))
        if local:
            self._credit = max(self._credit - 1.0, -1.0)
        # The worker with the least to make; of those, the one dealt to longest ago.
        side = None if local else min(room, key=lambda w: (self.working(w) / self.caps[w], self._last_dealt[w]))
        self._run = (side, self.runs - 1)
        return side

    def pull(self) -> bool:
        group = self.plans.next_run()
        if not group:
            return False
        worker = self._side()
        self._groups += 1
        if worker is not None:
            job = self.send(worker, group)
            self._working[worker].append(job)
            self._last_dealt[worker] = self._groups
        elif self.keep is not None:
            job = self.keep(group)
            self._working_local.append(job)
        else:
            self.local.extend(group)
            self.order.extend([None] * len(group))
            return True
        self.order.extend((job, k) for k in range(len(group)))
        return True

    def local_plans(self) -> Iterator[BatchPlan]:
        while True:
            while not self.local:
                if not self.pull():
                    return
            yield self.local.popleft()
