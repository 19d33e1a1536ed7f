"""Runs an image pipeline for one placement (``image_graph`` says which engine runs what), as a chain of parts:
the host forms each batch from the plans (``image_batches``: reading, checking, drawing every stage's
parameters), DALI decodes and runs the GPU stages that follow it in DALI (``image_dali``), and the torch stages
run the rest on the way to the batch delivered (``image_torch``, ``image_delivery``)."""
from __future__ import annotations

import time
from typing import Iterator

import numpy as np
import torch

from ...pipelines.image import infer_types
from ...pipelines.imaging.types import Dtype
from ...pipelines.spec import PipelineSpec
from ..cpu_time import process_cpu
from ..errors import Skipped
from ..sampler import BatchPlan
from ..skip_log import SkipLog
from ..sources.image_files import ImageFiles
from . import image_graph
from .buffers import BufferRing
from .contract import NO_TIMER, BatchInfo, RunnerConfig, StageTimer, StageTimes
from .image_batches import BatchFormer, HostBatch
from .image_dali import DaliSession
from .image_delivery import ImageDelivery
from .image_torch import TorchStages


class ImageRunner:
    def __init__(self, spec: PipelineSpec, source: ImageFiles, config: RunnerConfig, *,
                 gpu: torch.device | None = None, skips: SkipLog | None = None, decoded: bool = False,
                 former: type[BatchFormer] = BatchFormer):
        """``gpu``: the device that GPU-placed torch stages run on (default: ``config.device`` when it is a
        CUDA device, else ``cuda``); a test may pass the CPU to run them there. ``skips``: the log that the
        samples it leaves out go to (the Loader's; default: one of its own). ``decoded``: ``source`` reads
        decoded images (a cache's), which DALI takes instead of files (``image_graph.assign_engines``); ``former``:
        what forms the host batches (a cache's, which decodes what it does not hold yet)."""
        import nvidia.dali  # noqa: F401  (now, on this thread: its exit hook must be registered before the Loader's)

        self.spec = spec
        self.source = source
        self.graph = image_graph.assign_engines(spec, config.cut, infer_types(spec.stages[1:]), decoded=decoded)
        self.engines = self.graph.engines
        gpu = gpu or (config.device if config.device.type == "cuda" else torch.device("cuda"))
        self._outputs = BufferRing(capacity=config.prefetch + 3)  # queued, being made, with the trainer
        self.former = former(self.graph, source, config, read_stage=spec.stages[0].name, skips=skips)
        self.session = DaliSession(self.graph, self.former, source, config)
        self.delivery = ImageDelivery(self.graph, TorchStages(self.graph, gpu, self._allocate), source.labels,
                                      config.device)

    @property
    def skipped(self) -> list[Skipped]:
        return self.former.skips.skipped

    @property
    def outputs_reused(self) -> int:
        """How many batch tensors were taken again from this runner's ring instead of allocated anew: a
        delivered batch's memory returns to the ring once the trainer lets go of it."""
        return self._outputs.reused

    def _allocate(self, shape: tuple[int, ...], dtype: torch.dtype, pinned: bool) -> torch.Tensor:
        if pinned:
            return torch.empty(shape, dtype=dtype, pin_memory=True)  # torch caches pinned blocks itself
        return self._outputs.empty(shape, dtype)

    def host_batch(self, plan: BatchPlan) -> HostBatch:
        """The host part of one plan on its own (for tests and profiling)."""
        return self.former.one(plan)

    def batches(self, plans: Iterator[BatchPlan], timer: StageTimer = NO_TIMER
                ) -> Iterator[tuple[dict[str, torch.Tensor], BatchInfo]]:
        """Yields ``(batch, info)``, one per planned batch; ``timer`` adds up the time of each stage that runs
        on this thread (the read stage's and the torch stages')."""
        made = self._made(plans, timer)
        try:
            for batch, host in made:
                yield batch, host.info
        finally:
            made.close()

    def _made(self, plans: Iterator[BatchPlan], timer: StageTimer) -> Iterator[tuple[dict, HostBatch]]:
        self.former.begin(plans, timer)
        session = self.session
        session.begin()
        try:
            session.prime()
            while (made := session.next()) is not None:
                images, host = made
                if images is None:
                    yield self.delivery.padding(host), host
                    continue
                batch = self.delivery.batch(images, host, timer)
                session.made()
                yield batch, host
        finally:
            session.end()

    def profile(self, plans: list[BatchPlan]) -> StageTimes:
        """The plans' batches on this placement. The read stage and the torch stages are timed in thread
        seconds; on the CPU, DALI's decoding is the process's CPU time less this thread's; with stages on the
        GPU, the batches are timed end to end with the device synchronised, as one group."""
        names = [s.name for s in self.spec.stages]
        graph = self.graph
        timer = StageTimer()
        pixels = np.zeros(len(graph.stages))  # output pixels of each image stage, summed over the samples
        sync = torch.cuda.synchronize if graph.dali_on_gpu or any(s.gpu for s in graph.torch_steps) \
            else (lambda: None)
        sync()
        cpu0, thread0, wall0 = process_cpu(), time.thread_time(), time.perf_counter()
        samples = 0
        made = self._made(iter(plans), timer)
        try:
            for batch, host in made:
                if host.good:
                    pixels += np.asarray(host.pixels) * len(host.good)
                samples += len(batch["index"])
        finally:
            made.close()
        sync()
        wall = time.perf_counter() - wall0
        dali_cpu = max((process_cpu() - cpu0) - (time.thread_time() - thread0), 0.0)
        seconds = {names[0]: timer.seconds.pop(names[0], 0.0), **timer.seconds}
        pixels = pixels / max(samples, 1)
        indices = [i for p in plans for i in p.indices.tolist()]
        encoded = self.source.encoded_bytes(indices)
        bytes_out = {names[0]: encoded}
        for k, stage in enumerate(graph.stages):
            t = graph.types[k]
            per_pixel = t.channels * (1 if t.dtype is Dtype.UINT8 else 4)
            bytes_out[stage.name] = float(pixels[k] * per_pixel)
        together = {}
        on_gpu = tuple(n for n in names if self.engines[n] in (image_graph.DALI_MIXED, image_graph.DALI_GPU,
                                                               image_graph.TORCH_CUDA))
        if on_gpu:
            together[on_gpu] = wall
        else:
            seconds[graph.stages[0].name] = dali_cpu
        return StageTimes(samples, seconds, bytes_out, encoded, together, blocked=dict(timer.blocked))

    def close(self) -> None:
        self.session.close()
