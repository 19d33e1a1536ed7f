"""The Loader a trainer iterates: epochs of batches as dicts of torch tensors on the requested device."""
from __future__ import annotations

import dataclasses
import itertools
import logging
import warnings
from collections.abc import Mapping
from typing import Any, Iterator

import torch

from ..pipelines.spec import PipelineSpec
from .arguments import on_error_of, shuffle_buffer_rows, work_counts
from .background import BackgroundStream
from .cursor import Cursor
from .dataloader_habits import default_rank_world, refuse
from .delivery import Delivered
from .devices import gpu_available, is_gpu_failure, parse_device
from .errors import OnError, PlacementError, Skipped
from .guards import Iterations, ProcessGuard
from .placement import resolve
from .placement.auto import PROBE_SEED, AutoPlacement
from .placement.remote import RemoteDecision, decide as decide_remote, remote_report
from .runners import Runner, RunnerConfig, make_runner
from .runners.remote import (RayWorkers, RemoteRunner, available_workers, batches_per_group, connect,
                             object_store_seconds)
from .sampler import STATE_VERSION, EpochSampler, LastBatch, parse_last_batch
from .saved_state import check_resumable, configuration
from .sources import ChunkedTable, open_source
from .stream_order import StreamOrder
from .sources.image_headers import DEFAULT_MAX_PIXELS

log = logging.getLogger("feedline")


class Loader:
    """Iterate it for one epoch of batches; iterate again for the next (``with Loader(...) as loader:``
    closes it at the end).

    Each batch is a dict of torch tensors on ``device``: the pipeline's outputs, ``index`` (the dataset index of
    every sample) and ``valid`` (bool, beside ``index``: False for padding and for the slots of samples skipped
    with ``on_error="skip"``; mask the loss with it). ``shuffle`` defaults to the pipeline's own default (True
    for training pipelines and tables, False for ``image.val``). ``rank``/``world_size`` default to
    ``torch.distributed``'s when it is initialised. One iteration runs at a time: a new ``iter(loader)`` takes
    over, and an older iterator then raises ``StaleIteratorError``. A Loader that started iterating cannot be
    used in a child made by ``fork()`` (``ForkedLoaderError``); ``state_dict`` may be called from any thread.
    DataLoader arguments (``num_workers``, ``drop_last``, ...) are refused with feedline's equivalent.
    """

    def __init__(self, pipeline: PipelineSpec, batch_size: int, *, placement: str | Mapping = "auto",
                 device: str | torch.device | None = None, shuffle: bool | None = None, seed: int = 0,
                 last_batch: LastBatch | str = LastBatch.PARTIAL, rank: int | None = None,
                 world_size: int | None = None, num_threads: int | None = None, prefetch: int = 2,
                 on_error: OnError | str | None = None, max_pixels: int = DEFAULT_MAX_PIXELS,
                 max_batch_pixels: int | None = None, shuffle_buffer: int | None = None,
                 remote: RayWorkers | None = None, **dataloader_arguments):
        refuse(dataloader_arguments, self.__init__)
        if not isinstance(pipeline, PipelineSpec):
            raise TypeError(f"pipeline must be a feedline pipeline definition (e.g. feedline.pipelines.image.train"
                            f"(...)), got {type(pipeline).__name__}")
        rank, world_size = default_rank_world(rank, world_size)
        num_threads = work_counts(num_threads, prefetch, max_pixels)
        if max_batch_pixels is not None and (isinstance(max_batch_pixels, bool) or not isinstance(max_batch_pixels, int)
                                             or max_batch_pixels < max_pixels):
            raise ValueError(f"max_batch_pixels must be an integer of at least max_pixels ({max_pixels}), so that "
                             f"one image of max_pixels fits a batch; got {max_batch_pixels!r}")
        self.pipeline = pipeline
        self.on_error = on_error_of(pipeline, on_error)
        requested_device = parse_device(device)
        cut = resolve(pipeline, placement, gpu_available())
        if cut < pipeline.all_cpu and device is not None and requested_device.type == "cpu":
            if placement != "auto":
                raise PlacementError(f"placement {pipeline.describe_cut(cut)!r} runs stages on the GPU, so "
                                     f"batches arrive on the GPU; use device='cuda' (or leave device unset), or "
                                     f"placement='cpu'")
            cut = pipeline.all_cpu  # the trainer wants CPU tensors: keep the whole pipeline there
        if remote is not None and not isinstance(remote, RayWorkers):
            raise TypeError(f"remote must be a feedline.loader.RayWorkers, got {type(remote).__name__}")
        if remote is not None and cut < pipeline.all_cpu:
            if placement != "auto":
                raise PlacementError(f"remote workers run the CPU placement of a pipeline; placement "
                                     f"{pipeline.describe_cut(cut)!r} puts stages on the GPU")
            cut = pipeline.all_cpu
        self.device = torch.device("cuda") if device is None and cut < pipeline.all_cpu else requested_device
        self.shuffle_buffer = shuffle_buffer_rows(pipeline, shuffle_buffer)
        self.source = open_source(pipeline.source, cache_rows=2 * (self.shuffle_buffer or 0))
        self.sampler = self._order(batch_size, seed, shuffle=pipeline.default_shuffle if shuffle is None else shuffle,
                                   rank=rank, world_size=world_size, last_batch=parse_last_batch(last_batch))
        self.config = RunnerConfig(cut, self.device, self.sampler.batch_size, self.sampler.seed, num_threads,
                                   prefetch, self.on_error, max_pixels, max_batch_pixels=max_batch_pixels)
        self.remote = remote
        # The workers used: all of them with a fixed placement; with "auto", as many as pay, decided at the start.
        self._remote_workers = remote if placement != "auto" else None
        self.remote_decision: RemoteDecision | None = None
        self._auto = AutoPlacement(pipeline, self.config, self._local_runner, self._probe_order, num_threads,
                                   cpu_only=remote is not None) if placement == "auto" else None
        self._runner: Runner = self._runner_for(self.config)
        self._earlier_skips: list[Skipped] = []  # listed by runners this Loader has since replaced
        self.cursor = Cursor()
        self.epoch_summaries: dict[int, dict[str, int]] = {}
        self.fallbacks: list[str] = []
        self._stream: BackgroundStream | None = None
        self._stream_at: tuple[int, int] | None = None  # (epoch, sample) of the next batch the stream makes
        self._iterations = Iterations()
        self._process = ProcessGuard()
        log.info("feedline: %s placement %s (%s)", pipeline.name, pipeline.describe_cut(cut),
                 ", ".join(f"{k}={v.value}" for k, v in pipeline.backends_at(cut).items()))

    def _local_runner(self, config: RunnerConfig) -> Runner:
        return make_runner(self.pipeline, self.source, config)

    def _runner_for(self, config: RunnerConfig) -> Runner:
        if self._remote_workers is not None:
            return RemoteRunner(self.pipeline, self.source, config, self._remote_workers, self._local_runner,
                                group_rows=self.shuffle_buffer)
        return self._local_runner(config)

    def _order(self, batch_size: int, seed: int, **kwargs):
        """The order of this Loader's source: an exact permutation of samples, or, for a streamed table,
        chunks and a shuffle buffer (``stream_order``)."""
        if isinstance(self.source, ChunkedTable):
            return StreamOrder(self.source.chunk_rows, self.source.chunk_groups, batch_size, seed=seed,
                               buffer_rows=self.shuffle_buffer, **kwargs)
        return EpochSampler(len(self.source), batch_size, seed=seed, **kwargs)

    def _probe_order(self, batch_size: int, seed: int):
        """A one-rank shuffled order for profiling and probing placements, apart from the trainer's epochs."""
        return self._order(min(batch_size, len(self.source)), seed, shuffle=True)

    @property
    def batch_size(self) -> int:
        return self.sampler.batch_size

    @property
    def dataset(self):
        """The opened source (``len(loader.dataset)`` samples; for images also ``paths``, ``labels``, ``classes``)."""
        return self.source

    @property
    def cut(self) -> int:
        return self.config.cut

    @property
    def num_threads(self) -> int:
        return self.config.num_threads

    @property
    def prefetch(self) -> int:
        return self.config.prefetch

    @property
    def placement(self) -> dict[str, str]:
        """The backend of every stage, as placed now."""
        return {k: v.value for k, v in self.pipeline.backends_at(self.cut).items()}

    @property
    def epoch(self) -> int:
        return self.cursor.epoch

    @property
    def skipped(self) -> list[Skipped]:
        """Every sample left out with ``on_error="skip"``, once each, in the order met."""
        seen = {(s.where, s.index) for s in self._earlier_skips}
        return self._earlier_skips + [s for s in self._runner.skipped if (s.where, s.index) not in seen]

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` from its start (as ``DistributedSampler.set_epoch``)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        self.cursor.go_to(epoch, pinned=True)

    def __len__(self) -> int:
        """Batches per epoch on this rank (with ``on_error="skip"``, skips can make an epoch shorter)."""
        return len(self.sampler)

    def _open_stream(self) -> None:
        """Batches from the cursor on, made on the loader's own thread and running on into the epochs after
        it, so the next epoch's first batches are in flight while this epoch's last ones are consumed."""
        self._close_stream()
        epoch, start = self.cursor.next_sample
        done = 0 if self.cursor.complete else self.cursor.batches  # batches of ``epoch`` already delivered
        sampler = self.sampler  # the thread holds the sampler and the runner, never the Loader
        plans = (plan for e in itertools.count(epoch)
                 for plan in sampler.epoch(e, start_sample=start if e == epoch else 0,
                                           first_batch=done if e == epoch else 0))
        where = f"making {self.pipeline.name!r} batches from sample {start} of epoch {epoch} on " \
                f"(placement {self.pipeline.describe_cut(self.cut)})"
        batches = self._runner.batches
        self._stream = BackgroundStream(lambda: Delivered(batches(plans)), self.prefetch,
                                        cuda=self.device if self.device.type == "cuda" else None,
                                        describe=lambda: where)
        self._stream_at = (epoch, start)

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream, self._stream_at = None, None

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        self._process.check()
        token = self._iterations.start()
        self._process.started()
        self.cursor.begin()
        if self._auto is not None and self._auto.plan is None:
            plan = self._auto.start()
            if self.remote is not None:
                self._decide_remote(plan)
            self._follow(plan)
        if self._stream is None or self._stream_at != self.cursor.next_sample:
            self._open_stream()
        epoch, samples, padding, skipped = self.cursor.epoch, 0, 0, 0
        while not self.cursor.complete:
            batch, info, valid = self._next()
            skipped += info.skipped
            self.cursor.advance(info, delivered=batch is not None)
            self._stream_at = self.cursor.next_sample
            if batch is not None:
                samples += valid
                padding += len(batch["index"]) - valid
                if self._auto is not None:
                    plan = self._auto.delivered(len(batch["index"]))
                    if plan is not None:
                        self._follow(plan)  # the next batch comes from the new placement, after this one
                yield batch
                self._iterations.check(token, epoch)
        self.epoch_summaries[epoch] = {"batches": self.cursor.batches, "samples": samples, "padding": padding,
                                       "skipped": skipped}
        log.log(logging.WARNING if skipped else logging.INFO, "feedline: epoch %d delivered %d samples (and %d "
                "padding) in %d batches, skipped %d", epoch, samples, padding, self.cursor.batches, skipped)

    def _next(self) -> tuple[dict | None, Any, int]:
        """The next ``(batch, info, valid samples)``. If the GPU fails under a GPU placement, move to the CPU
        placement and make the batch in flight again there."""
        self._process.check()
        while True:
            try:
                if self._auto is not None:
                    with self._auto.wait.waiting():
                        return next(self._stream)
                return next(self._stream)
            except Exception as exc:
                if not (self.cut < self.pipeline.all_cpu and is_gpu_failure(exc)):
                    self._close_stream()
                    raise
                old = self.pipeline.describe_cut(self.cut)
                self._move(self.pipeline.all_cpu, self.num_threads, self.prefetch)
                self._auto = None  # the GPU is gone for this run; placement stays on the CPU
                first_line = str(exc).splitlines()[0] if str(exc) else ""
                self.fallbacks.append(f"{old} -> cpu: {type(exc).__name__}: {first_line}")
                warnings.warn(f"feedline: the GPU failed during placement {old!r} ({type(exc).__name__}: {exc}); "
                              f"continuing on the CPU placement from the batch in flight", RuntimeWarning,
                              stacklevel=3)
            except BaseException:
                self._close_stream()
                raise

    def _decide_remote(self, plan) -> None:
        """With ``placement="auto"``: how many remote workers to add to the local plan (none unless the CPU
        limits it), from its measured cost per batch and the measured cost of receiving one (``placement.remote``)."""
        ray = connect(self.remote)
        probe = self._local_runner(dataclasses.replace(self.config, cut=plan.cut, num_threads=1, seed=PROBE_SEED))
        batches = probe.batches(iter(self._probe_order(self.config.batch_size, PROBE_SEED).epoch(0)))
        try:
            sample = next(batch for batch, _ in batches if batch is not None)
        finally:
            batches.close()
            probe.close()
        group = batches_per_group(self.shuffle_buffer, self.config.batch_size)  # a table's: one buffer-full
        put_s, take_s = object_store_seconds(ray, sample, self.device, per_object=group)
        decision = decide_remote(plan, workers=self.remote.num_workers, cpus_per_worker=self.remote.cpus_per_worker,
                                 available_workers=available_workers(ray, self.remote), transfer_s=take_s,
                                 put_s=put_s if group > 1 else 0.0, balanced=group > 1)
        self.remote_decision = decision
        log.info("feedline: remote workers %s", decision.why)
        if decision.workers:
            self._remote_workers = dataclasses.replace(self.remote, num_workers=decision.workers)
            self._move(self.cut, self.num_threads, self.prefetch)  # the runner made so far does not deal plans out

    def _follow(self, plan) -> None:
        if (plan.cut, plan.threads, plan.prefetch) != (self.cut, self.num_threads, self.prefetch):
            self._move(plan.cut, plan.threads, plan.prefetch)
        self._auto.moved()

    def _move(self, cut: int, threads: int, prefetch: int) -> None:
        """Run from now on with another placement, for a new plan or after a GPU failure: the next stream
        starts after the last delivered batch, so nothing made but not delivered is lost or repeated."""
        self._close_stream()
        self._earlier_skips = self.skipped
        self._runner.close()
        device = torch.device("cuda") if cut < self.pipeline.all_cpu and self.device.type != "cuda" else self.device
        self.device = device
        self.config = dataclasses.replace(self.config, cut=cut, num_threads=threads, prefetch=prefetch, device=device)
        self._runner = self._runner_for(self.config)
        self._open_stream()
        log.info("feedline: %s placement %s, %d threads, prefetch %d", self.pipeline.name,
                 self.pipeline.describe_cut(cut), threads, prefetch)

    @property
    def plan(self) -> dict[str, Any]:
        """The current placement decision: with ``placement="auto"``, the scheduler's plan, the measurements
        behind it and the history of changes; otherwise the fixed placement."""
        report = self._auto.report() if self._auto is not None else {
            "placement": self.pipeline.describe_cut(self.cut), "cut": self.cut, "threads": self.num_threads,
            "prefetch": self.prefetch, "stages": self.placement, "fallbacks": list(self.fallbacks)}
        if self.remote is not None:
            report["remote"] = remote_report(self.remote, self._remote_workers, self.remote_decision)
        return report

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: loading it into a Loader of the same configuration resumes at the next batch.
        Safe to call from another thread while the trainer iterates (it sees the position before or after a
        batch, never halfway)."""
        return {"version": STATE_VERSION, **self.cursor.state(),
                "skipped": [[k.where, k.reason, k.index, k.epoch] for k in self.skipped],
                "config": configuration(self.sampler, self.pipeline.name, self.on_error.value, self.shuffle_buffer)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a feedline Loader state of version {STATE_VERSION}: "
                             f"{state.get('version') if isinstance(state, Mapping) else type(state).__name__}")
        check_resumable(state.get("config", {}), self.state_dict()["config"])
        self.cursor.load(state, self.sampler.shard_size)
        self._close_stream()
        try:
            earlier = [Skipped(*entry) for entry in state.get("skipped", [])]
        except TypeError:
            raise ValueError("state has an invalid 'skipped' list") from None
        self._earlier_skips = earlier + [k for k in self._earlier_skips if k not in earlier]

    def close(self) -> None:
        if self._process.forked:  # the thread and pipelines are the parent's: let go, never join or free them
            self._stream = None
            return
        self._close_stream()
        self._runner.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self):
        try:
            if self._stream is not None and not self._process.forked:
                self._stream.close(wait=False)  # see BackgroundStream.close
        except Exception:
            pass
