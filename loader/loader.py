"""The Loader a trainer iterates: epochs of batches as dicts of torch tensors on the requested device."""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Callable, Iterator

import torch

from ..pipelines.spec import PipelineSpec
from ..pipelines.validate import int_at_least
from .cache_policy import CacheSettings
from .cursor import Cursor
from .dataloader_habits import default_rank_world, refuse
from .devices import parse_device
from .epoch_stream import EpochStream
from .errors import OnError, Skipped
from .guards import Iterations, ProcessGuard
from .loader_arguments import batch_pixels, cache_of, on_error_of, shuffle_buffer_rows, work_counts
from .loader_state import composed, resume_from
from .mix_weights import order_to_reweigh, weights_of
from .opened_pipeline import OpenedPipeline
from .placement.controller import PlacementController
from .runners import Runner, RunnerConfig
from .runners.remote import RayWorkers
from .remainder import plain
from .sampler import LastBatch, parse_last_batch
from .saved_state import configuration
from .skip_log import SkipLog
from .sources.image_headers import DEFAULT_MAX_PIXELS
from .stats import DeliveryMeter

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
    Where each stage runs, and when that changes, is its ``PlacementController``'s to decide; the Loader follows.
    """

    def __init__(self, pipeline: PipelineSpec, batch_size: int, *, placement: str | Mapping = "auto",
                 device: str | torch.device | None = None, shuffle: bool | None = None, seed: int = 0,
                 last_batch: LastBatch | str = LastBatch.PARTIAL, rank: int | None = None,
                 world_size: int | None = None, num_threads: int | None = None, prefetch: int = 2,
                 on_error: OnError | str | None = None, max_pixels: int = DEFAULT_MAX_PIXELS,
                 max_batch_pixels: int | None = None, shuffle_buffer: int | None = None,
                 remote: RayWorkers | None = None, cache: CacheSettings | str = "auto", **dataloader_arguments):
        refuse(dataloader_arguments, self.__init__)
        if not isinstance(pipeline, PipelineSpec):
            raise TypeError(f"pipeline must be a feedline pipeline definition (e.g. feedline.pipelines.image.train"
                            f"(...)), got {type(pipeline).__name__}")
        rank, world_size = default_rank_world(rank, world_size)
        num_threads, prefetch, max_pixels = work_counts(num_threads, prefetch, max_pixels)
        max_batch_pixels = batch_pixels(max_batch_pixels, max_pixels)
        self.pipeline = pipeline
        self.on_error = on_error_of(pipeline, on_error)
        self.cache = cache_of(pipeline, cache)  # what may be cached (``cache_policy``); the runner decides
        self.placer = PlacementController(pipeline, placement, remote=remote,
                                          device=None if device is None else parse_device(device))
        self.shuffle_buffer = shuffle_buffer_rows(pipeline, shuffle_buffer)
        # Every sample left out, whoever met it: this Loader's runners, its table source, its remote workers.
        self.skips = SkipLog()
        # One rank, no remote workers: a gzip table may be indexed while its first batches are made.
        self._opened = OpenedPipeline(pipeline, cache=self.cache, shuffle_buffer=self.shuffle_buffer, skips=self.skips,
                                      lazy_index=remote is None and world_size == 1)
        self.source = self._opened.source
        self.sampler = self._opened.order(batch_size, seed, rank=rank, world_size=world_size,
                                          shuffle=pipeline.default_shuffle if shuffle is None else shuffle,
                                          last_batch=parse_last_batch(last_batch))
        self.placer.attach(RunnerConfig(self.placer.cut, self.placer.device, self.sampler.batch_size,
                                        self.sampler.seed, num_threads, prefetch, self.on_error, max_pixels,
                                        max_batch_pixels=max_batch_pixels, cache=self.cache),
                           runners=self._opened.local_runner, orders=self._opened.probe_order,
                           group_rows=self.shuffle_buffer, follow=self._follow)
        self._runner: Runner = self._opened.runner(self.config, self.placer.remote_workers)
        self.cursor = Cursor()
        self.epoch_summaries: dict[int, dict[str, int]] = {}
        self.meter = DeliveryMeter(self.placer.waits)  # the last batches (``stats``), on the scheduler's clock
        self._stream = EpochStream()
        self._iterations = Iterations()
        self._process = ProcessGuard()

    # the runners and orders apart from the trainer's, as ``profile`` asks for them
    _local_runner = property(lambda self: self._opened.local_runner)
    _probe_order = property(lambda self: self._opened.probe_order)

    # ---- what it is now (placement: ``placer``'s) --------------------------------------------------
    batch_size = property(lambda self: self.sampler.batch_size)
    config = property(lambda self: self.placer.config, doc="The runner configuration the batches are made with.")
    device = property(lambda self: self.placer.device, doc="The torch device batches are delivered on.")
    cut = property(lambda self: self.placer.cut)
    num_threads = property(lambda self: self.placer.threads)
    prefetch = property(lambda self: self.placer.prefetch)
    placement = property(lambda self: self.placer.stages, doc="The backend of every stage, as placed now.")
    remote = property(lambda self: self.placer.remote, doc="The remote workers asked for (or None).")
    remote_decision = property(lambda self: self.placer.remote_decision)
    fallbacks = property(lambda self: self.placer.fallbacks, doc="GPU failures that moved placement to the CPU.")
    epoch = property(lambda self: self.cursor.epoch)
    runner = property(lambda self: self._runner, doc="The runner making batches now (tests, diagnostics).")
    background = property(lambda self: self._stream.thread, doc="The batch thread while one runs, else None.")

    @property
    def dataset(self):
        """The opened source (``len(loader.dataset)`` samples; for images also ``paths``, ``labels``, ``classes``;
        for a mix, ``names``, ``parts`` (each source opened) and ``offsets``)."""
        return self.source

    @property
    def weights(self) -> dict[str, float]:
        """A mix's weights now (normalised), by source name; the names in order are ``pipeline.names``."""
        return weights_of(self.sampler, self.pipeline.name)

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """A mix draws with ``weights`` (source name -> positive weight, every source named) from the next batch
        the trainer gets on: batches made ahead (``prefetch``) but not yet delivered are made again with the new
        weights, so the switch falls at the same batch whatever the threads' timing, and a state saved later
        resumes with the weights in force (``state_dict`` keeps them, with where each change began)."""
        epoch, place = self.cursor.next_sample
        order = order_to_reweigh(self.sampler, self.pipeline.name, epoch)  # (``mix_weights``)
        running = self._stream.thread is not None
        self._stream.close()
        order.set_weights(weights, epoch, place)
        if running:
            self._open_stream()

    @property
    def plan(self) -> dict[str, Any]:
        """The current placement decision: with ``placement="auto"``, the scheduler's, the measurements behind
        it and the history of changes; otherwise the fixed placement. ``cache``: whether the pipeline's
        deterministic prefix is cached, why, and the figures (``cache_policy.decide``)."""
        return {**self.placer.report(), "cache": self._opened.cache_report()}

    @property
    def skipped(self) -> list[Skipped]:
        """Every sample left out with ``on_error="skip"``, once each, in the order met (``SkipLog``)."""
        return list(self.skips.skipped)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` from its start (as ``DistributedSampler.set_epoch``): the whole
        epoch, also after a resume on another number of ranks mid-way through it."""
        self.cursor.go_to(int_at_least("epoch", epoch, 0), pinned=True)
        if self.sampler is not plain(self.sampler):  # (its batches made ahead are the rest's)
            self.sampler = plain(self.sampler)
            self._stream.close()

    def __len__(self) -> int:
        """Batches per epoch on this rank (with ``on_error="skip"``, skips can make an epoch shorter). While a
        gzip table's index is still being built (a first open), an estimate; exact once it is complete."""
        return len(self.sampler)

    def _open_stream(self) -> None:
        """Batches from the cursor on, made on the loader's own thread and running on into the epochs after it."""
        self._stream.open(self.sampler, self._runner.batches, self.cursor, prefetch=self.prefetch, device=self.device,
                          making=f"{self.pipeline.name!r} batches", placement=self.pipeline.describe_cut(self.cut))

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        process, iterations, cursor, stream = self._process, self._iterations, self.cursor, self._stream
        process.check()
        token = iterations.start()
        process.started()
        cursor.begin()
        self.placer.begin()
        if not stream.stands_at(cursor.next_sample):
            self._open_stream()
        take, delivered = self.meter.monitor.take, self.meter.monitor.delivered  # (per batch: no meter's call)
        epoch, samples, padding, skipped = cursor.epoch, 0, 0, 0
        while not cursor.place.complete:  # (a field read in C: no property call per batch)
            if process.copied:  # (a fork hook's mark: no system call per batch)
                process.check()
            try:
                batch, info, valid, rows = take(stream.next)
            except BaseException as exc:
                batch, info, valid, rows = self._after_failure(exc)
            skipped += info.skipped
            stream.at = cursor.advance(info, delivered=batch is not None)
            if batch is not None:
                samples += valid
                padding += rows - valid
                delivered(valid)
                self.placer.delivered(rows)  # a new placement makes the batches after this one
                yield batch
                if token is not iterations.active:
                    iterations.check(token, epoch)
        self.epoch_summaries[epoch] = {"batches": cursor.batches, "samples": samples, "padding": padding,
                                       "skipped": skipped}
        log.log(logging.WARNING if skipped else logging.INFO, "feedline: epoch %d delivered %d samples (and %d "
                "padding) in %d batches, skipped %d", epoch, samples, padding, cursor.batches, skipped)

    def _after_failure(self, error: BaseException) -> tuple[dict | None, Any, int, int]:
        """The next ``(batch, info, valid samples, rows)`` after taking one raised ``error``: if the GPU failed under a
        GPU placement, the controller moves to the CPU placement and the batch in flight is made again there; any
        other error stops the stream and is raised."""
        while isinstance(error, Exception) and self.placer.fall_back(error):
            try:
                return self.meter.monitor.take(self._stream.next)
            except BaseException as exc:
                error = exc
        self._stream.close()
        raise error

    def _follow(self, config: RunnerConfig) -> None:
        """Run from now on with the controller's new ``config``: the next stream starts after the last delivered
        batch, so nothing made but not delivered is lost or repeated."""
        self._stream.close()
        self._runner.close()
        self._runner = self._opened.runner(config, self.placer.remote_workers)
        self._open_stream()

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: loading it into a Loader of the same configuration resumes at the next batch.
        Safe to call from another thread while the trainer iterates (it sees the position before or after a
        batch, never halfway)."""
        order = self.sampler
        config = configuration(order, self.pipeline.name, self.on_error.value, self.shuffle_buffer)
        return composed(self.cursor, order, self.skips, config)  # (``loader_state``)

    def load_state_dict(self, state: Mapping[str, Any] | list[Mapping[str, Any]]) -> None:
        """Resume where ``state`` stands: the state this rank saved, or the list of the states of every rank of a
        job (``torch.distributed.all_gather_object``), which may have had another number of ranks: then this job's
        ranks share the rest of that epoch, every sample once (``feedline.loader.resume``)."""
        resume = resume_from(state, self.sampler, self.state_dict()["config"])
        self.cursor.load(resume.position, resume.order.shard_size)
        self.sampler = resume.order
        self._stream.close()
        self.skips.load(resume.skipped)

    def profile(self, batches: int = 40, *, trainer_step_ms: float | str | None = None,
                train_step: Callable[[dict], Any] | None = None):
        """Time this loader's stages and delivery between iterations, under a simulated trainer step (ms or
        "auto") or your own ``train_step(batch)`` if given (``feedline.loader.profile.profile_loader``)."""
        from .profile import profile_loader
        return profile_loader(self, batches=batches, trainer_step_ms=trainer_step_ms, train_step=train_step)

    def stats(self) -> dict[str, Any]:
        """Its figures now: placement, rates, stage times, skips (``feedline.loader.stats``)."""
        from .stats import loader_stats
        return loader_stats(self)

    def close(self) -> None:
        if self._process.forked:  # the thread and pipelines are the parent's: let go, never join or free them
            self._stream.let_go()
            return
        self._stream.close()
        self._runner.close()
        scan = getattr(self.source, "growing", None)  # a gzip table's index still being built: stop it
        if scan is not None:
            scan.stop()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self):
        try:
            if not self._process.forked:
                self._stream.close(wait=False)  # see BackgroundStream.close
        except Exception:
            pass
