"""A Loader's pipeline with its source opened once, and the orders and runners made over that source: for a mix,
each of its sources' (``MixOrder``, ``MixRunner``); for a streamed table, chunks and a shuffle buffer
(``StreamOrder``); otherwise an exact permutation of the samples (``EpochSampler``)."""
from __future__ import annotations

from typing import Any

from ..pipelines.mix import MixSpec
from ..pipelines.spec import PipelineSpec
from .cache_policy import CacheSettings
from .mix_order import MixOrder
from .runners import Runner, RunnerConfig, make_runner
from .runners.image_cache import ImageCaches
from .runners.mix_runner import MixRunner
from .runners.remote import RayWorkers, RemoteRunner
from .sampler import EpochSampler
from .skip_log import SkipLog
from .sources import ChunkedTable, open_source
from .sources.mixed import MixedSources
from .stream_order import StreamOrder


class OpenedPipeline:
    """``pipeline`` over its ``source``, opened once and shared by every runner made here. What a runner or the
    source leaves out goes to ``skips``; ``shuffle_buffer`` is a table's buffer in rows (None for images)."""

    def __init__(self, pipeline: PipelineSpec, *, cache: CacheSettings, shuffle_buffer: int | None,
                 skips: SkipLog, lazy_index: bool = False):
        """``lazy_index``: a table of one gzip file may be indexed while its first rows are read (one rank, no
        remote workers: ``ChunkedTable``'s ``lazy_index``); never for a mix."""
        self.pipeline, self.cache, self.shuffle_buffer, self.skips = pipeline, cache, shuffle_buffer, skips
        self.lazy_index = lazy_index and not isinstance(pipeline, MixSpec)
        self.caches = ImageCaches(cache)  # the image stores, kept across the runners they serve
        self.source = MixedSources(pipeline, self._open) if isinstance(pipeline, MixSpec) else \
            self._open(pipeline.source)

    def _open(self, declared):
        return open_source(declared, cache_rows=2 * (self.shuffle_buffer or 0), skips=self.skips, cache=self.cache,
                           lazy_index=self.lazy_index)

    def order(self, batch_size: int, seed: int, **kwargs):
        """The order of the source: an exact permutation of samples, or, for a streamed table, chunks and a
        shuffle buffer (``stream_order``)."""
        if isinstance(self.source, MixedSources):
            return MixOrder(self.pipeline, self.source, batch_size, seed=seed, buffer_rows=self.shuffle_buffer,
                            **kwargs)
        if isinstance(self.source, ChunkedTable):
            return StreamOrder(self.source.chunk_rows, self.source.chunk_groups, batch_size, seed=seed,
                               buffer_rows=self.shuffle_buffer, table=self.source, **kwargs)
        return EpochSampler(len(self.source), batch_size, seed=seed, **kwargs)

    def probe_order(self, batch_size: int, seed: int):
        """A one-rank shuffled order for profiling and probing placements, apart from the trainer's epochs."""
        return self.order(min(batch_size, len(self.source)), seed, shuffle=True)

    def local_runner(self, config: RunnerConfig) -> Runner:
        """A runner of its own skips (images): for probing placements, and a remote runner's local side."""
        if isinstance(self.source, MixedSources):
            return MixRunner(self.pipeline, self.source, config, make_runner)
        return make_runner(self.pipeline, self.source, config)

    def runner(self, config: RunnerConfig, remote_workers: RayWorkers | None) -> Runner:
        """The runner that makes the trainer's batches (on ``remote_workers`` where given), listing what it leaves
        out in ``skips``."""
        if isinstance(self.source, MixedSources):
            if remote_workers is not None:
                raise ValueError("remote workers do not run a mix yet: give the Loader remote=None, or run each "
                                 "source's Loader with remote workers")
            return MixRunner(self.pipeline, self.source, config,
                             lambda spec, source, cfg: make_runner(spec, source, cfg, skips=self.skips))
        if remote_workers is not None:
            return RemoteRunner(self.pipeline, self.source, config, remote_workers, self.local_runner,
                                group_rows=self.shuffle_buffer, skips=self.skips)
        return make_runner(self.pipeline, self.source, config, skips=self.skips, caches=self.caches)

    def cache_report(self) -> dict[str, Any]:
        """Whether the deterministic prefix is cached, why, and the figures: a text table's reader decides for
        its chunks, the image stores for images (``cache_policy.decide``)."""
        table = getattr(getattr(self.source, "reader", None), "cache_decision", None)
        return self.caches.report() if table is None else table.as_dict()
