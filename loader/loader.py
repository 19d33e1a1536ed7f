"""The Loader a trainer iterates: epochs of batches as dicts of torch tensors on the requested device."""
from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Mapping
from typing import Any, Iterator

import torch

from ..pipelines.image_files import ImageFiles
from ..pipelines.spec import PipelineSpec
from . import placement as placements
from .devices import gpu_available, parse_device
from .runner import Runner
from .sampler import STATE_VERSION, EpochSampler, LastBatch, parse_last_batch

log = logging.getLogger("feedline")


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _distributed_rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class Loader:
    """Iterate it for one epoch of batches; iterate again for the next.

    Each batch is a dict of torch tensors on ``device``: the pipeline's outputs plus ``index`` (the dataset
    index of every sample) and, with ``last_batch="pad"``, ``valid`` (False for padding) in batches that
    hold padding. ``rank``/``world_size`` default to ``torch.distributed``'s when it is initialised.
    """

    def __init__(self, pipeline: PipelineSpec, batch_size: int, *, placement: str | Mapping = "auto",
                 device: str | torch.device | None = None, shuffle: bool = True, seed: int = 0,
                 last_batch: LastBatch | str = LastBatch.PARTIAL, rank: int | None = None,
                 world_size: int | None = None, num_threads: int | None = None, prefetch: int = 2):
        if not isinstance(pipeline, PipelineSpec):
            raise TypeError(f"pipeline must be a feedline pipeline definition (e.g. feedline.pipelines.image.train"
                            f"(...)), got {type(pipeline).__name__}")
        if (rank is None) != (world_size is None):
            raise ValueError(f"give both rank and world_size or neither; got rank={rank!r}, world_size={world_size!r}")
        if rank is None:
            rank, world_size = _distributed_rank_world()
        if num_threads is None:
            num_threads = _available_cores()
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be a positive integer, got {num_threads!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or not 1 <= prefetch <= 16:
            raise ValueError(f"prefetch must be an integer in [1, 16], got {prefetch!r}")
        self.pipeline = pipeline
        self.device = parse_device(device)
        self.sampler = EpochSampler(len(pipeline.source), batch_size, shuffle=shuffle, seed=seed, rank=rank,
                                    world_size=world_size, last_batch=parse_last_batch(last_batch))
        self.cut = placements.resolve(pipeline, placement, gpu_available())
        self.num_threads = num_threads
        self.prefetch = prefetch
        self._runner = self._make_runner()
        self._epoch = 0
        self._position = 0   # batches delivered in self._epoch
        self._resume = False
        self._stream: Iterator[dict] | None = None
        self._stream_at: tuple[int, int] | None = None
        log.info("feedline: %s placement %s (%s)", pipeline.name, pipeline.describe_cut(self.cut),
                 ", ".join(f"{k}={v.value}" for k, v in pipeline.backends_at(self.cut).items()))

    def _make_runner(self) -> Runner:
        if isinstance(self.pipeline.source, ImageFiles):
            from .image_runner import ImageRunner
            return ImageRunner(self.pipeline, self.cut, self.device, batch_size=self.sampler.batch_size,
                               seed=self.sampler.seed, num_threads=self.num_threads, prefetch=self.prefetch)
        from .feature_runner import FeatureRunner
        return FeatureRunner(self.pipeline, self.cut, self.device, prefetch=self.prefetch,
                             num_threads=self.num_threads)

    @property
    def placement(self) -> dict[str, str]:
        """The backend of every stage, as placed now."""
        return {k: v.value for k, v in self.pipeline.backends_at(self.cut).items()}

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` from its start (as ``DistributedSampler.set_epoch``)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        self._epoch, self._position, self._resume = epoch, 0, True

    def __len__(self) -> int:
        return len(self.sampler)

    def _plans(self, epoch: int, start: int):
        for e in itertools.count(epoch):
            yield from self.sampler.epoch(e, start if e == epoch else 0)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if not self._resume and self._position > 0:
            self._epoch, self._position = self._epoch + 1, 0
        self._resume = False
        if self._stream is None or self._stream_at != (self._epoch, self._position):
            self._close_stream()
            # One stream runs across epoch boundaries, so the next epoch's first batches are in flight
            # while this epoch's last ones are consumed.
            self._stream = self._runner.batches(self._plans(self._epoch, self._position))
        epoch = self._epoch
        while self._epoch == epoch and self._position < len(self):
            try:
                batch = next(self._stream)
            except BaseException:
                self._close_stream()
                raise
            self._position += 1
            self._stream_at = (self._epoch, self._position) if self._position < len(self) else (self._epoch + 1, 0)
            yield batch

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream, self._stream_at = None, None

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: loading it into a Loader of the same configuration resumes at the next batch."""
        s = self.sampler
        return {"version": STATE_VERSION, "epoch": self._epoch, "position": self._position,
                "config": {"num_samples": s.num_samples, "batch_size": s.batch_size, "seed": s.seed,
                           "shuffle": s.shuffle, "rank": s.rank, "world_size": s.world_size,
                           "last_batch": s.last_batch.value, "pipeline": self.pipeline.name}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a feedline Loader state of version {STATE_VERSION}: "
                             f"{state.get('version') if isinstance(state, Mapping) else type(state).__name__}")
        mine = self.state_dict()["config"]
        theirs = state.get("config", {})
        differ = {k: (theirs.get(k), v) for k, v in mine.items() if theirs.get(k) != v}
        if differ:
            raise ValueError("state was saved by a differently configured Loader; (saved, this loader): "
                             + ", ".join(f"{k}: {a!r} vs {b!r}" for k, (a, b) in differ.items()))
        epoch, position = state["epoch"], state["position"]
        if not (isinstance(epoch, int) and epoch >= 0 and isinstance(position, int) and 0 <= position <= len(self)):
            raise ValueError(f"state has an invalid position: epoch={epoch!r}, position={position!r}")
        self._epoch, self._position = epoch, position
        self._resume = position < len(self)
        if not self._resume:
            self._epoch, self._position, self._resume = epoch + 1, 0, True

    def close(self) -> None:
        self._close_stream()
        self._runner.close()

    def __del__(self):
        try:
            self._close_stream()
        except Exception:
            pass
