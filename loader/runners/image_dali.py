"""The DALI part of an image pipeline: one DALI pipeline, built once and fed batch by batch through one external
source, so epochs never restart it and the order, sharding and resumption stay with the Loader; and what
happens when it fails."""
from __future__ import annotations

from collections import deque

from ..devices import is_gpu_failure
from ..errors import OnError
from ..sources.image_files import ImageFiles
from . import image_graph
from .contract import RunnerConfig
from .image_batches import BatchFormer, HostBatch
from .image_faults import sample_at_fault


class DaliSession:
    """Runs ``former``'s batches through DALI, in order. Its state: the pipeline (None once a failure discarded
    it), whether the pipeline is fresh (nothing scheduled yet), whether DALI said the stream ended, and the
    batches formed for DALI and not yet taken out (``pending``), in order."""

    def __init__(self, graph: image_graph.ImageGraph, former: BatchFormer, source: ImageFiles,
                 config: RunnerConfig):
        self.graph = graph
        self.former = former
        self.source = source
        self.config = config
        self.feed_names = image_graph.feed_names(graph, former.params.example())
        self.pending: deque[HostBatch] = deque()
        self._pipe = None
        self._current = None  # what ``pipeline`` returned for this stream
        self._fresh = True
        self._ended = False

    def pipeline(self):
        """The DALI pipeline, built on first use (tests wrap this to make it fail)."""
        if self._pipe is None:
            from nvidia.dali import Pipeline

            config = self.config
            device_id = (config.device.index or 0) if self.graph.dali_on_gpu else None
            pipe = Pipeline(batch_size=config.batch_size, num_threads=config.num_threads, device_id=device_id,
                            prefetch_queue_depth=config.prefetch, seed=config.seed)
            with pipe:
                pipe.set_outputs(image_graph.define(self.graph, self.feed_names, self._next_inputs))
            pipe.build()
            self._pipe, self._fresh = pipe, True
        return self._pipe

    def begin(self) -> None:
        """For a new stream of the former's: the pipeline, built if it is not (``prime`` starts it)."""
        self._ended = False
        self._current = self.pipeline()

    def prime(self) -> None:
        # A fresh DALI pipeline fills its whole prefetch queue on the first schedule_run.
        for _ in range(1 if self._fresh else self.config.prefetch):
            self._current.schedule_run()
        self._fresh = False

    def next(self) -> tuple[object | None, HostBatch] | None:
        """The next batch in plan order: DALI's output with the host batch it was made from, ``(None, host)``
        for a batch of padding only, or None after the stream's last. Call ``made`` once DALI's output has been
        copied out. With ``on_error="skip"``, a sample DALI fails on is skipped and its batch formed again."""
        while True:
            if self.pending and (self._ended or not self.pending[0].good):
                return None, self.pending.popleft()
            if self._ended:
                return None
            try:
                (images,) = self._current.outputs()
            except StopIteration:
                self._ended = True
                continue
            except RuntimeError as exc:
                self._recover(exc)
                self._current = self.pipeline()
                self.prime()
                continue
            return images, self.pending.popleft()

    def made(self) -> None:
        """DALI's last output is copied out: DALI may make the next batch into its buffers."""
        self._current.schedule_run()

    def end(self) -> None:
        """After the stream, or when it stops early: a finished pipeline is reset for the next stream; an
        unfinished one's outputs still queued are taken out and dropped."""
        if self._pipe is None:
            return  # the failed pipeline was discarded; the next stream builds a fresh one
        if self._ended:
            self._current.reset()
            self._fresh = True
        else:
            for host in self.pending:
                if host.good:
                    self._current.outputs()
            self.pending.clear()

    def close(self) -> None:
        self._pipe = self._current = None

    def _next_inputs(self) -> tuple:
        """DALI's external source: the next batch's inputs, or the end of the stream. Batches whose samples
        were all bad are queued as pending without entering DALI."""
        while True:
            batch = self.former.next()
            if batch is None:
                raise StopIteration
            self.pending.append(batch)
            if batch.good:
                return tuple(batch.feeds[name] for name in self.feed_names)

    def _recover(self, exc: RuntimeError) -> None:
        """DALI invalidates a pipeline that fails. Name the sample at fault; with ``skip``, mark it, push every
        pending batch's samples back and let a fresh pipeline form them again. Where no sample is at fault and
        DALI's message says the GPU failed (out of memory, nvJPEG, CUDA, a lost device), that error goes on as
        it is, for the Loader to move to the CPU."""
        pending = list(self.pending)
        self.pending.clear()
        self._pipe, self._fresh = None, True
        gpu_failed = is_gpu_failure(exc)
        sample, error = sample_at_fault(self.source, next(h for h in pending if h.good), exc,
                                        ask_dali=not gpu_failed)
        if sample is None and gpu_failed:
            raise exc
        if self.former.on_error is OnError.RAISE or sample is None:
            raise error from None
        self.former.form_again(pending, sample, error)
