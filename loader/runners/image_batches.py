"""Forming image batches from the Loader's plans on the host: each sample read and its header checked, bad
samples raised or (``on_error="skip"``) left out by the rule of ``SkipFill``, every image stage's parameters
drawn, and DALI's inputs for the batch."""
from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from ...pipelines.image_params import StageParams
from ..errors import DataError, OnError
from ..sampler import BatchPlan
from ..skip_log import SkipLog
from ..sources.image_files import ImageFiles
from . import image_graph
from .contract import NO_TIMER, BatchInfo, RunnerConfig, SkipFill, StageTimer
from .image_budget import PixelBudget, default_batch_pixels
from .image_graph import ImageGraph


@dataclass(frozen=True)
class Sample:
    epoch: int
    index: int
    valid: bool
    position: int      # in this rank's order for the epoch
    batch: int         # the number of the batch its plan was, in the epoch
    shard: int | None  # the epoch's samples on this rank (see BatchPlan)


@dataclass
class EpochFill:
    """How far forming one epoch's batches is (``SkipFill.FROM_LATER_SAMPLES``): the next batch's number, and
    whether any good sample came at all (in an epoch this stream began at its start)."""

    epoch: int
    batch: int
    shard: int | None
    from_start: bool
    good: int = 0
    finished: bool = False


class SampleQueue:
    """The Loader's plans as a stream of single samples, so that a batch can be filled past a bad sample and
    a failed batch can be pushed back and formed again."""

    def __init__(self, plans: Iterator[BatchPlan]):
        self._plans = iter(plans)
        self._items: deque[Sample] = deque()

    def peek(self) -> Sample | None:
        while not self._items:
            plan = next(self._plans, None)
            if plan is None:
                return None
            self._items.extend(Sample(plan.epoch, i, v, plan.start + k, plan.batch, plan.shard)
                               for k, (i, v) in enumerate(zip(plan.indices.tolist(), plan.valid.tolist())))
        return self._items[0]

    def pop(self) -> Sample:
        sample = self.peek()
        self._items.popleft()
        return sample

    def push_front(self, samples: list[Sample]) -> None:
        self._items.extendleft(reversed(samples))


@dataclass
class HostBatch:
    """One batch as the host prepared it: the samples taken (bad ones included), every image stage's
    parameters for the good ones, DALI's inputs, and ``pad`` slots of padding after the good samples. A batch
    without good samples is all padding and never enters DALI."""

    taken: list[Sample]
    good: list[Sample]
    info: BatchInfo
    pad: int = 0
    fill_before: EpochFill | None = None  # the epoch's progress before this batch, to form it again
    params: list[dict] = field(default_factory=list)   # per image stage: name -> one row per good sample
    feeds: dict[str, object] = field(default_factory=dict)
    pixels: list[float] = field(default_factory=list)  # per image stage: mean output pixels per sample


class BatchFormer:
    """Forms the host part of the batches of one stream of plans at a time (``begin``); its state is the
    samples still to form (``queue``) and the epoch's progress. The samples it leaves out go to ``skips`` (the
    Loader's log, or one of its own)."""

    def __init__(self, graph: ImageGraph, source: ImageFiles, config: RunnerConfig, read_stage: str,
                 skips: SkipLog | None = None):
        self.graph = graph
        self.source = source
        self.params = StageParams(graph.stages)
        self.batch_size = config.batch_size
        self.seed = config.seed
        self.on_error = config.on_error
        self.max_pixels = config.max_pixels
        self.budget = PixelBudget(config.max_batch_pixels or default_batch_pixels(config.batch_size,
                                                                                  config.max_pixels),
                                  config.batch_size, source.where)
        self.read_stage = read_stage
        self._form: Callable[[], HostBatch | None] = {SkipFill.FROM_LATER_SAMPLES: self._fill_from_later,
                                                      SkipFill.PADDING: self._own_plan}[config.skip_fill]
        self.skips = SkipLog() if skips is None else skips
        self.undecodable: dict[int, DataError] = {}  # samples DALI failed on, raised again where they come back
        self.queue = SampleQueue(iter(()))
        self.fill: EpochFill | None = None
        self.timer: StageTimer = NO_TIMER

    def begin(self, plans: Iterator[BatchPlan], timer: StageTimer = NO_TIMER) -> None:
        self.queue, self.fill, self.timer = SampleQueue(plans), None, timer

    def next(self) -> HostBatch | None:
        """The next batch's host part (its time is the read stage's), or None after the stream's last."""
        started = self.timer.start()
        batch = self._form()
        self.timer.stop(self.read_stage, started)
        return batch

    def one(self, plan: BatchPlan) -> HostBatch:
        """The host part of one plan on its own (for tests and profiling)."""
        saved = self.queue
        self.queue = SampleQueue(iter([plan]))
        try:
            return self._form()
        finally:
            self.queue = saved

    def form_again(self, batches: list[HostBatch], sample: Sample, error: DataError) -> None:
        """``batches`` (in order, formed but not made) go back to be formed again, without ``sample``."""
        self.undecodable[sample.index] = error
        self.queue.push_front([s for batch in batches for s in batch.taken])
        self.fill = batches[0].fill_before

    def _fill_from_later(self) -> HostBatch | None:
        """``SkipFill.FROM_LATER_SAMPLES``: as many good samples as the batch's planned size, taken in order past
        the bad ones. Where the epoch runs out of samples first, the rest of the batch is padding, and so are any
        batches still planned: every rank makes exactly its planned batches of their planned sizes (a DDP job
        cannot hang on a rank that skipped more)."""
        first = self.queue.peek()
        before = dataclasses.replace(self.fill) if self.fill is not None else None
        fill = self.fill
        if fill is None or fill.finished:
            if first is None:
                return None
            fill = self.fill = EpochFill(first.epoch, first.batch, first.shard, from_start=first.position == 0)
        target = self.batch_size if fill.shard is None else min(self.batch_size,
                                                                fill.shard - fill.batch * self.batch_size)
        taken, good, encoded, sizes = self._take(lambda sample, good: len(good) < target and
                                                 sample.epoch == fill.epoch)
        after = self.queue.peek()
        run_out = after is None or after.epoch != fill.epoch
        fill.batch += 1
        fill.good += len(good)
        fill.finished = run_out if fill.shard is None else fill.batch * self.batch_size >= fill.shard
        if fill.finished and fill.from_start and not fill.good:
            # Nothing on this rank can be delivered, ever; padding epoch after epoch would hide it.
            first_skip = self.skips.first()
            raise DataError(self.source.origin, f"every sample of epoch {fill.epoch} on this rank was bad and "
                                                f"skipped (first: {first_skip.where}: {first_skip.reason})")
        padded = run_out and fill.shard is not None
        end = fill.shard if padded else taken[-1].position + 1
        info = BatchInfo(fill.epoch, end, fill.finished, skipped=len(taken) - len(good))
        return self._prepare(HostBatch(taken, good, info, target - len(good) if padded else 0, before), encoded,
                             sizes)

    def _own_plan(self) -> HostBatch | None:
        """``SkipFill.PADDING``: the next plan's batch from its own samples; those a bad sample leaves empty are
        padding, after the good ones."""
        first = self.queue.peek()
        if first is None:
            return None
        taken, good, encoded, sizes = self._take(lambda sample, good: (sample.epoch, sample.batch) ==
                                                 (first.epoch, first.batch))
        end = taken[-1].position + 1
        after = self.queue.peek()
        last = end >= first.shard if first.shard is not None else (after is None or after.epoch != first.epoch)
        info = BatchInfo(first.epoch, end, last, skipped=len(taken) - len(good))
        return self._prepare(HostBatch(taken, good, info, len(taken) - len(good)), encoded, sizes)

    def _take(self, more) -> tuple[list, list, list, list]:
        """Samples off the queue while ``more(sample, good so far)``, each read: taken, the good ones, their
        bytes and sizes (a bad one raises, or with on_error="skip" is listed and left out). The good ones'
        header pixels stay within the budget (``PixelBudget``)."""
        taken, good, encoded, sizes = [], [], [], []
        pixels = 0
        while True:
            sample = self.queue.peek()
            if sample is None or not more(sample, good):
                return taken, good, encoded, sizes
            taken.append(self.queue.pop())
            try:
                data, size = self._read(sample)
            except DataError as err:
                if self.on_error is OnError.RAISE:
                    raise
                self.skips.add_error(err, sample.index, sample.epoch)
                continue
            good.append(sample)
            encoded.append(data)
            sizes.append(size)
            pixels += int(size[0]) * int(size[1])
            while pixels > self.budget.batch_pixels:
                k, error = self.budget.blame([s.index for s in good], sizes, pixels)
                if self.on_error is OnError.RAISE:
                    raise error
                self.skips.add_error(error, good[k].index, good[k].epoch)
                pixels -= int(sizes[k][0]) * int(sizes[k][1])
                del good[k], encoded[k], sizes[k]

    def _read(self, sample: Sample) -> tuple[np.ndarray, np.ndarray]:
        if sample.index in self.undecodable:
            raise self.undecodable[sample.index]
        return self.source.read_checked(sample.index, self.max_pixels)

    def _prepare(self, batch: HostBatch, encoded: list, sizes: list) -> HostBatch:
        """``batch`` with its good samples' stage parameters and DALI feeds."""
        if batch.good:
            indices = np.array([s.index for s in batch.good], dtype=np.int64)
            batch.params, batch.pixels = self.params.draw(self.seed, batch.info.epoch, indices,
                                                          np.array(sizes, dtype=np.int64).reshape(-1, 2))
            batch.feeds = image_graph.feeds(self.graph, encoded, batch.params)
        return batch
