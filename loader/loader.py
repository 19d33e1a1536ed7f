"""The Loader a trainer iterates: epochs of batches as dicts of torch tensors on the requested device."""
from __future__ import annotations

import itertools
import logging
import warnings
from collections import deque
from collections.abc import Mapping
from typing import Any, Iterator

import torch

from ..pipelines.image_files import ImageFiles
from ..pipelines.spec import PipelineSpec
from . import placement as placements
from .autoplace import AutoPlacement
from .devices import available_cores, gpu_available, is_gpu_failure, parse_device
from .runner import BatchInfo, Runner
from .errors import OnError, PlacementError, parse_on_error
from .image_headers import DEFAULT_MAX_PIXELS
from .sampler import STATE_VERSION, EpochSampler, LastBatch, parse_last_batch

log = logging.getLogger("feedline")


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
                 world_size: int | None = None, num_threads: int | None = None, prefetch: int = 2,
                 on_error: OnError | str | None = None, max_pixels: int = DEFAULT_MAX_PIXELS):
        if not isinstance(pipeline, PipelineSpec):
            raise TypeError(f"pipeline must be a feedline pipeline definition (e.g. feedline.pipelines.image.train"
                            f"(...)), got {type(pipeline).__name__}")
        if (rank is None) != (world_size is None):
            raise ValueError(f"give both rank and world_size or neither; got rank={rank!r}, world_size={world_size!r}")
        if rank is None:
            rank, world_size = _distributed_rank_world()
        if num_threads is None:
            num_threads = available_cores()
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be a positive integer, got {num_threads!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or not 1 <= prefetch <= 16:
            raise ValueError(f"prefetch must be an integer in [1, 16], got {prefetch!r}")
        if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
            raise ValueError(f"max_pixels must be a positive integer, got {max_pixels!r}")
        self.on_error = self._on_error(pipeline, on_error)
        self.max_pixels = max_pixels
        self.pipeline = pipeline
        requested_device = parse_device(device)
        self.cut = placements.resolve(pipeline, placement, gpu_available())
        if self.cut < pipeline.all_cpu and device is not None and requested_device.type == "cpu":
            if placement != "auto":
                raise PlacementError(f"placement {pipeline.describe_cut(self.cut)!r} runs stages on the GPU, so "
                                     f"batches arrive on the GPU; use device='cuda' (or leave device unset), or "
                                     f"placement='cpu'")
            self.cut = pipeline.all_cpu  # the trainer wants CPU tensors: keep the whole pipeline there
        self.device = torch.device("cuda") if device is None and self.cut < pipeline.all_cpu else requested_device
        self.sampler = EpochSampler(len(pipeline.source), batch_size, shuffle=shuffle, seed=seed, rank=rank,
                                    world_size=world_size, last_batch=parse_last_batch(last_batch))
        self.num_threads = num_threads
        self.prefetch = prefetch
        self._auto = AutoPlacement(pipeline, self.sampler.batch_size, self.device, num_threads) \
            if placement == "auto" else None
        self._runner = self._make_runner()
        self._epoch = 0
        self._position = 0   # batches delivered in self._epoch
        self._cursor = 0     # samples of this rank's order for self._epoch consumed by those batches
        self._complete = False  # the epoch's last batch was delivered
        self._resume = False
        self.epoch_summaries: dict[int, dict[str, int]] = {}
        self.fallbacks: list[str] = []
        self._stream: Iterator[dict] | None = None
        self._stream_at: tuple[int, int] | None = None
        log.info("feedline: %s placement %s (%s)", pipeline.name, pipeline.describe_cut(self.cut),
                 ", ".join(f"{k}={v.value}" for k, v in pipeline.backends_at(self.cut).items()))

    @staticmethod
    def _on_error(pipeline: PipelineSpec, on_error: OnError | str | None) -> OnError:
        declared = getattr(pipeline.source, "on_error", None)  # tabular sources validate rows when opened
        if on_error is None:
            return declared or OnError.RAISE
        chosen = parse_on_error(on_error)
        if declared is not None and declared is not chosen:
            raise ValueError(f"on_error={chosen.value!r} differs from the {declared.value!r} that pipeline "
                             f"{pipeline.name!r} was defined with; set it where the pipeline is defined "
                             f"(e.g. criteo(..., on_error={chosen.value!r}))")
        return chosen

    def _make_runner(self) -> Runner:
        if isinstance(self.pipeline.source, ImageFiles):
            from .image_runner import ImageRunner
            return ImageRunner(self.pipeline, self.cut, self.device, batch_size=self.sampler.batch_size,
                               seed=self.sampler.seed, num_threads=self.num_threads, prefetch=self.prefetch,
                               on_error=self.on_error, max_pixels=self.max_pixels)
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

    @property
    def skipped(self) -> list:
        """Every sample left out with ``on_error="skip"``, once each, in the order met."""
        found = getattr(self._runner, "skipped", ())
        return list(found.values()) if isinstance(found, dict) else list(found)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` from its start (as ``DistributedSampler.set_epoch``)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        self._epoch, self._position, self._cursor, self._complete, self._resume = epoch, 0, 0, False, True

    def __len__(self) -> int:
        """Batches per epoch on this rank (with ``on_error="skip"``, skips can make an epoch shorter)."""
        return len(self.sampler)

    def _plans(self, epoch: int, cursor: int):
        for e in itertools.count(epoch):
            yield from self.sampler.epoch(e, start_sample=cursor if e == epoch else 0)

    def _delivered(self, plans):
        """(batch, info) from the runner; runners that deliver one batch per plan are paired with their plans."""
        if getattr(self._runner, "yields_info", False):
            yield from self._runner.batches(plans)
            return
        taken: deque = deque()

        def feed():
            for plan in plans:
                taken.append(plan)
                yield plan

        for batch in self._runner.batches(feed()):
            plan = taken.popleft()
            yield batch, BatchInfo(plan.epoch, plan.start + plan.indices.size, plan.last)

    def _open_stream(self):
        """Batches from the current position on, running on into the epochs after it."""
        return self._delivered(self._plans(self._epoch, self._cursor))

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if not self._resume and (self._position > 0 or self._complete):
            self._epoch, self._position, self._cursor, self._complete = self._epoch + 1, 0, 0, False
        self._resume = False
        if self._auto is not None and self._auto.plan is None:
            self._follow(self._auto.start())
        if self._stream is None or self._stream_at != (self._epoch, self._cursor):
            self._close_stream()
            # One stream runs across epoch boundaries, so the next epoch's first batches are in flight
            # while this epoch's last ones are consumed.
            self._stream = self._open_stream()
        epoch, samples = self._epoch, 0
        while not self._complete:
            try:
                if self._auto is not None:
                    with self._auto.wait.waiting():
                        batch, info = next(self._stream)
                else:
                    batch, info = next(self._stream)
            except Exception as exc:
                self._close_stream()
                if not (self.cut < self.pipeline.all_cpu and is_gpu_failure(exc)):
                    raise
                self._fall_back_to_cpu(exc)
                self._stream = self._open_stream()
                continue
            except BaseException:
                self._close_stream()
                raise
            self._cursor, self._complete = info.end, info.last
            self._stream_at = (epoch + 1, 0) if info.last else (epoch, info.end)
            if batch is not None:
                self._position += 1
                samples += len(batch["index"])
                plan = self._auto.delivered(len(batch["index"])) if self._auto is not None else None
                if plan is not None:
                    self._follow(plan)  # the next batch comes from the new placement, after this one
                    self._stream = self._open_stream() \
                        if not self._complete else None
                yield batch
        skipped = sum(1 for s in getattr(self._runner, "skip_events", ()) if s.epoch == epoch)
        self.epoch_summaries[epoch] = {"batches": self._position, "samples": samples, "skipped": skipped}
        log.log(logging.WARNING if skipped else logging.INFO, "feedline: epoch %d delivered %d samples in %d "
                "batches, skipped %d", epoch, samples, self._position, skipped)

    def _fall_back_to_cpu(self, exc: BaseException) -> None:
        """Rebuild on the CPU placement; the stream restarts after the last delivered batch, so the batch in
        flight when the GPU failed is produced again on the CPU, not lost."""
        old = self.pipeline.describe_cut(self.cut)
        self._rebuild(self.pipeline.all_cpu, self.num_threads, self.prefetch)
        self._auto = None  # the GPU is gone for this run; placement stays on the CPU
        self.fallbacks.append(f"{old} -> cpu: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        warnings.warn(f"feedline: the GPU failed during placement {old!r} ({type(exc).__name__}: {exc}); "
                      f"continuing on the CPU placement from the batch in flight", RuntimeWarning, stacklevel=3)

    def _rebuild(self, cut: int, threads: int, prefetch: int) -> None:
        """Run from now on with another placement; the next stream starts after the last delivered batch."""
        self._close_stream()
        self._runner.close()
        self.cut, self.num_threads, self.prefetch = cut, threads, prefetch
        if cut < self.pipeline.all_cpu and self.device.type != "cuda":
            self.device = torch.device("cuda")
        self._runner = self._make_runner()
        log.info("feedline: %s placement %s, %d threads, prefetch %d", self.pipeline.name,
                 self.pipeline.describe_cut(cut), threads, prefetch)

    def _follow(self, plan) -> None:
        if (plan.cut, plan.threads, plan.prefetch) != (self.cut, self.num_threads, self.prefetch):
            self._rebuild(plan.cut, plan.threads, plan.prefetch)
        self._auto.moved()

    @property
    def plan(self) -> dict[str, Any]:
        """The current placement decision: with ``placement="auto"``, the scheduler's plan, the measurements
        behind it and the history of changes; otherwise the fixed placement."""
        if self._auto is not None:
            return self._auto.report()
        return {"placement": self.pipeline.describe_cut(self.cut), "cut": self.cut, "threads": self.num_threads,
                "prefetch": self.prefetch, "stages": self.placement, "fallbacks": list(self.fallbacks)}

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream, self._stream_at = None, None

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: loading it into a Loader of the same configuration resumes at the next batch."""
        s = self.sampler
        return {"version": STATE_VERSION, "epoch": self._epoch, "position": self._position, "cursor": self._cursor,
                "complete": self._complete,
                "config": {"num_samples": s.num_samples, "batch_size": s.batch_size, "seed": s.seed,
                           "shuffle": s.shuffle, "rank": s.rank, "world_size": s.world_size,
                           "last_batch": s.last_batch.value, "pipeline": self.pipeline.name,
                           "on_error": self.on_error.value}}

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
        epoch, position, cursor, complete = (state.get(k) for k in ("epoch", "position", "cursor", "complete"))
        ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (epoch, position, cursor))
        if not ok or not isinstance(complete, bool) or cursor > self.sampler.shard_size(epoch):
            raise ValueError(f"state has an invalid position: epoch={epoch!r}, position={position!r}, "
                             f"cursor={cursor!r}, complete={complete!r}")
        self._close_stream()
        if complete:
            self._epoch, self._position, self._cursor, self._complete = epoch + 1, 0, 0, False
        else:
            self._epoch, self._position, self._cursor, self._complete = epoch, position, cursor, False
        self._resume = True

    def close(self) -> None:
        self._close_stream()
        self._runner.close()

    def __del__(self):
        try:
            self._close_stream()
        except Exception:
            pass
