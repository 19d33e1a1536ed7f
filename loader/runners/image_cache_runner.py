"""An image runner that pays for the deterministic prefix once (issue 22).

- ``OUTPUT`` (every stage deterministic, as ``image.val``): the first epoch runs the pipeline and keeps each
  sample's row of the batch; an epoch whose samples are all kept is then served from the store, no file read
  or decoded, through the same batch forming (so skips, padding and batch boundaries are the same).
- ``DECODED`` (``image.train``): the decoded images are kept; DALI is fed them instead of the files
  (``image_graph`` with ``decoded=True``: the decoder's window cut out of the decoded image), and the random
  stages run every epoch. A sample not kept yet is read and decoded on the host and kept.

The first epoch measures recomputing (seconds per sample made) and then reading the store; ``cache_policy.decide``
says whether later epochs use it. A decision not to use it runs the plain pipeline from then on.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Iterator

import numpy as np
import torch

from ...pipelines.imaging.types import Dtype
from ...pipelines.spec import PipelineSpec
from ..cache_policy import CacheDecision, available_bytes, decide
from ..devices import is_gpu_failure
from ..errors import DataError, OnError, Skipped
from ..sampler import BatchPlan
from ..skip_log import SkipLog
from .contract import NO_TIMER, BatchInfo, RunnerConfig, StageTimer, StageTimes
from .image_batches import BatchFormer
from .image_cache import DECODED, OUTPUT, DiskStore, ImageCaches, cache_key, cache_kind
from .image_faults import sample_at_fault
from .image_runner import ImageRunner
from .plan_runs import PlanRuns

READ_PROBE = 64  # samples read back from a store to time it


class _StoreSource:
    """The source as a batch former sees it, with samples read from the store: ``read`` gives
    ``(data, (width, height))`` or raises; everything else is the source's."""

    def __init__(self, source, read):
        self._source, self.read_checked = source, read

    def __getattr__(self, name):
        return getattr(self._source, name)


class _Decoder:
    """Decodes batches of encoded samples to uint8 RGB ``HWC`` on the host, with DALI's decoder of the placement
    (``mixed`` on a GPU: nvJPEG) on the runner's threads, so the pixels are those the uncached pipeline decodes."""

    def __init__(self, device_id: int | None, batch_size: int, num_threads: int):
        self.device_id, self.batch_size, self.num_threads = device_id, batch_size, num_threads
        self._pipe = None

    def _build(self):
        from nvidia.dali import Pipeline, fn, types

        pipe = Pipeline(batch_size=self.batch_size, num_threads=self.num_threads, device_id=self.device_id,
                        prefetch_queue_depth=1, exec_async=False, exec_pipelined=False)
        with pipe:
            encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
            pipe.set_outputs(fn.decoders.image(encoded, device="cpu" if self.device_id is None else "mixed",
                                               output_type=types.RGB))
        pipe.build()
        return pipe

    def decode(self, encoded: list[np.ndarray]) -> list[np.ndarray]:
        """The decoded images; a RuntimeError (DALI's) where one cannot be decoded."""
        if self._pipe is None:
            self._pipe = self._build()
        try:
            self._pipe.feed_input("encoded", encoded)
            (out,) = self._pipe.run()
        except RuntimeError:
            self._pipe = None  # DALI invalidates a pipeline that failed
            raise
        if self.device_id is not None:
            out = out.as_cpu()
        return [np.array(out[i]) for i in range(len(encoded))]


def capped_size(size: np.ndarray, max_side: int | None) -> np.ndarray:
    """``(width, height)`` with the longer side at most ``max_side`` (None: as it is), the aspect kept."""
    w, h = int(size[0]), int(size[1])
    if max_side is None or max(w, h) <= max_side:
        return size
    scale = max_side / max(w, h)
    return np.array([max(1, round(w * scale)), max(1, round(h * scale))], dtype=np.int64)


def capped(image: np.ndarray, size: np.ndarray) -> np.ndarray:
    """``image`` (``HWC`` uint8) resized to ``size`` (``(width, height)``) where it differs: bilinear with
    antialiasing, as torchvision's ``resize`` of a tensor."""
    w, h = int(size[0]), int(size[1])
    if image.shape[:2] == (h, w):
        return image
    t = torch.from_numpy(image).permute(2, 0, 1)[None].float()
    t = torch.nn.functional.interpolate(t, size=(h, w), mode="bilinear", antialias=True, align_corners=False)
    return t.round_().clamp_(0, 255).to(torch.uint8)[0].permute(1, 2, 0).contiguous().numpy()


class _DecodingFormer(BatchFormer):
    """Forms batches of decoded images: those the store holds, and the rest decoded together on the runner's
    threads (and kept). A sample that cannot be decoded is left out as DALI's failures are (``form_again``)."""

    cache: "CachedImageRunner"

    def _prepare(self, batch, encoded: list, sizes: list):
        missing = [k for k, data in enumerate(encoded) if data.ndim == 1]
        if missing:
            cache = self.cache
            started = time.perf_counter()
            try:
                images = cache.decoder.decode([encoded[k] for k in missing])
            except RuntimeError as exc:  # named as the uncached pipeline names it (``image_faults``)
                subset = dataclasses.replace(batch, good=[batch.good[k] for k in missing])
                sample, error = sample_at_fault(self.source, subset, exc, ask_dali=not is_gpu_failure(exc))
                if sample is None or self.on_error is OnError.RAISE:
                    raise error from None
                self.form_again([batch], sample, error)
                return self._form()
            cache.made_s += time.perf_counter() - started
            cache.made += len(missing)
            for k, image in zip(missing, images):
                image = encoded[k] = capped(image, sizes[k])
                cache.store.put(batch.good[k].index, image)
        return super()._prepare(batch, encoded, sizes)


class CachedImageRunner:
    """``ImageRunner``'s batches, bit for bit, with the deterministic prefix cached (see the module)."""

    def __init__(self, spec: PipelineSpec, source, config: RunnerConfig, caches: ImageCaches,
                 skips: SkipLog | None = None):
        self.spec, self.source, self.config, self.caches = spec, source, config, caches
        self.plain = ImageRunner(spec, source, config, skips=skips)
        graph = self.plain.graph
        self.kind = cache_kind(graph.stages)
        engines = sorted(graph.engines.items()) if self.kind == OUTPUT else graph.engines[graph.stages[0].name]
        prefix = graph.stages if self.kind == OUTPUT else ()
        self.max_side = caches.settings.decoded_max_side
        if self.max_side is not None and self.kind == OUTPUT:
            raise ValueError(f"cache=CacheSettings(decoded_max_side={self.max_side}) caps the decoded images a "
                             f"cache keeps for pipelines with a random stage after decoding (image.train); every "
                             f"stage of pipeline {spec.name!r} is deterministic, so its whole output is kept")
        what = f"{self.kind} {[repr(s) for s in prefix]} {engines} {config.max_pixels} {config.device.type} " \
               f"{self.max_side}"
        dtype = np.float32 if self.kind == OUTPUT and graph.output.dtype is Dtype.FLOAT32 else np.uint8
        # On disk the key names the files' versions (a stat of each file); in RAM the store lives and dies with
        # this Loader's source, so the prefix and placement name it.
        self.key = cache_key(spec, source, what) if caches.settings.directory is not None else what
        self.store = caches.store(self.key, self.kind, dtype)
        self.made_s, self.made = 0.0, 0  # recomputing, measured: seconds and samples
        self.decoded = None
        if self.kind == DECODED:
            device_id = (config.device.index or 0) if graph.dali_on_gpu else None
            self.decoder = _Decoder(device_id, config.batch_size, config.num_threads)
            former = type("DecodingFormer", (_DecodingFormer,), {"cache": self})
            self.decoded = ImageRunner(spec, _StoreSource(source, self._read_decoded), config,
                                       skips=self.plain.former.skips, decoded=True, former=former)

    @property
    def skipped(self) -> list[Skipped]:
        return self.plain.skipped

    @property
    def making(self) -> ImageRunner:
        """The image runner that makes the batches now: the one fed decoded images while they are kept or
        measured, else the plain one."""
        decision = self.decision
        if self.decoded is not None and (decision is None or decision.use or self.max_side is not None):
            return self.decoded
        return self.plain

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("plain", "decoded", "caches", "key", "kind"):
            raise AttributeError(name)
        return getattr(self.making, name)  # what an ImageRunner has (tests and diagnostics ask for it)

    @property
    def decision(self) -> CacheDecision | None:
        return self.caches.decisions.get(self.key)

    def batches(self, plans: Iterator[BatchPlan], timer: StageTimer = NO_TIMER
                ) -> Iterator[tuple[dict[str, torch.Tensor], BatchInfo]]:
        plans = PlanRuns(plans, key=lambda plan: plan.epoch)  # one epoch at a time
        if self.decision is None and self.store.complete and self.store.recompute_s is not None:
            self._decide(self.store.recompute_s)  # a whole store on disk, filled by an earlier run
        while epoch := plans.next_run():
            decision = self.decision
            if decision is not None and not decision.use and self.max_side is None:
                yield from self.plain.batches(itertools.chain(epoch, plans.rest()), timer)
                return
            if self.kind == DECODED:
                if decision is not None:
                    yield from self.decoded.batches(itertools.chain(epoch, plans.rest()), timer)
                    return
                yield from self._measured(self.decoded.batches(iter(epoch), timer), keep=False)
            elif decision is not None and self._held(epoch):
                yield from self._from_store(epoch, timer)
            else:
                yield from self._measured(self.plain.batches(iter(epoch), timer), keep=True)
            self._filled()

    # ---- filling and measuring ------------------------------------------------------------------
    def _measured(self, made: Iterator, keep: bool) -> Iterator:
        """``made``'s batches, timing how long each takes to make; ``keep``: each sample's row goes to the store."""
        try:
            while True:
                started = time.perf_counter()
                item = next(made, None)
                if item is None:
                    return
                batch, info = item
                if keep:
                    self.made_s += time.perf_counter() - started
                    self._keep(batch)
                yield batch, info
        finally:
            made.close()

    def _keep(self, batch: dict) -> None:
        index = batch["index"].numpy()
        valid = batch.get("valid")
        rows = np.flatnonzero(index >= 0) if valid is None else np.flatnonzero((index >= 0) & valid.numpy())
        self.made += int(np.sum(index >= 0))
        if rows.size and not self.store.overflowed:
            images = batch["image"].cpu().numpy()
            for r in rows.tolist():
                self.store.put(int(index[r]), images[r])

    def _read_decoded(self, index: int, max_pixels: int):
        """A held sample's decoded image, else its encoded bytes (``_DecodingFormer`` decodes them)."""
        image = self.store.get(index)
        if image is not None:
            return image, np.array([image.shape[1], image.shape[0]], dtype=np.int64)
        data, size = self.source.read_checked(index, max_pixels)
        return data, capped_size(size, self.caches.settings.decoded_max_side)

    def _filled(self) -> None:
        """After an epoch made without the store: list the bad samples, finish a disk store that holds every
        sample, and decide once something was measured."""
        for skip in self.plain.skipped:
            if skip.index is not None and skip.index not in self.store:
                self.store.bad.setdefault(skip.index, (skip.where, skip.reason))
        recompute = self.made_s / self.made if self.made else None
        self.store.finish(len(self.source), recompute)
        if self.decision is None and recompute is not None:
            self._decide(recompute)

    def _decide(self, recompute_s: float) -> None:
        settings = self.caches.settings
        held = [i for i in itertools.islice(iter(self._held_indices()), READ_PROBE)]
        read_s = self._read_cost(held) if held else float("inf")
        per_sample = self.store.nbytes / max(len(self.store), 1)
        needed = int(per_sample * max(len(self.source) - len(self.store.bad), 0))
        space = settings.memory_bytes if settings.directory is None else \
            available_bytes(settings, held=self.store.nbytes)
        what = "whole output" if self.kind == OUTPUT else "decoded images"
        if self.store.overflowed:
            needed = max(needed, self.store.budget + 1)
        decision = decide(what=f"{self.spec.name}: {what}", recompute_s=recompute_s,
                          read_s=read_s if np.isfinite(read_s) else 1e9, bytes_needed=needed,
                          settings=settings, space_bytes=space)
        self.caches.decisions[self.key] = decision
        if not decision.use:
            self.store.drop()

    def _held_indices(self):
        return self.store.records if isinstance(self.store, DiskStore) else self.store.items

    def _read_cost(self, indices: list[int]) -> float:
        """Seconds per sample to read ``indices`` back from the store into a batch's memory, as serving does: into
        memory already in use (a batch buffer of the ring), not fresh allocations, whose page faults cost more
        than the copy (timed so, a 224-pixel float output's read measured 0.68-1.16 ms a sample where serving
        took 0.12)."""
        largest = max(self.store.get(i).nbytes for i in indices)
        into = np.zeros(largest, dtype=np.uint8)  # (its pages touched before the clock starts)
        started = time.perf_counter()
        for i in indices:
            row = np.ascontiguousarray(self.store.get(i)).reshape(-1).view(np.uint8)  # a mapped file's pages read
            into[:row.size] = row
        return (time.perf_counter() - started) / len(indices)

    # ---- serving from the store ------------------------------------------------------------------
    def _held(self, epoch: list[BatchPlan]) -> bool:
        store = self.store
        return all(i in store or i in store.bad for plan in epoch for i in plan.indices.tolist())

    def _read_output(self, index: int, max_pixels: int):
        if index in self.store.bad:
            where, reason = self.store.bad[index]
            raise DataError(where, reason)
        return None, np.ones(2, dtype=np.int64)

    def _from_store(self, epoch: list[BatchPlan], timer: StageTimer) -> Iterator:
        if not hasattr(self, "_former"):
            self._former = BatchFormer(self.plain.graph, _StoreSource(self.source, self._read_output), self.config,
                                       read_stage=self.spec.stages[0].name, skips=self.plain.former.skips)
        former, delivery = self._former, self.plain.delivery
        former.begin(iter(epoch), timer)
        while (host := former.next()) is not None:
            if not host.good:
                yield delivery.padding(host), host.info
                continue
            images = torch.from_numpy(np.stack([self.store.get(s.index) for s in host.good]))
            yield delivery.stored(images, host), host.info

    def profile(self, plans: list[BatchPlan]) -> StageTimes:
        return self.plain.profile(plans)

    def close(self) -> None:
        self.plain.close()
        if self.decoded is not None:
            self.decoded.close()
