"""A GPU that fails mid-epoch (out of memory, lost device) sends the Loader to the CPU placement without
losing or repeating a sample. The failure is injected: a stand-in runner plays the GPU placement."""
import dataclasses
import warnings

import pytest
import torch

from feedline.loader import Loader, epoch_stream, opened_pipeline
from feedline.loader.background import BackgroundStream
from feedline.loader.placement import controller as controller_module
from feedline.loader.devices import is_gpu_failure
from feedline.pipelines import image


class FailingGpuRunner:
    """Delivers ``good`` batches the way the real runner would, then fails as a GPU does."""

    def __init__(self, real, good: int, error: BaseException):
        self.real, self.good, self.error = real, good, error

    @property
    def skipped(self):
        return self.real.skipped

    def batches(self, plans):
        for k, item in enumerate(self.real.batches(plans)):
            if k == self.good:
                raise self.error
            yield item

    def close(self):
        self.real.close()


def as_if_on_a_gpu(monkeypatch) -> torch.device:
    """A machine whose placement controller sees a GPU, with no CUDA stream to make batches on here: the
    stand-in runners make the GPU placement's batches on the CPU (returned)."""
    monkeypatch.setattr(controller_module, "gpu_available", lambda: True)
    monkeypatch.setattr(epoch_stream, "BackgroundStream",
                        lambda make, depth, *, cuda=None, describe: BackgroundStream(make, depth, describe=describe))
    return torch.device("cpu")


@pytest.mark.parametrize("error", [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("CUDA error: an illegal memory access was encountered"),
    RuntimeError("nvJPEG error: device lost"),
])
def test_gpu_failure_falls_back_to_cpu_without_losing_a_batch(image_dir, monkeypatch, error):
    spec = image.train(image_dir, size=32, output="uint8")
    cpu = as_if_on_a_gpu(monkeypatch)
    make = opened_pipeline.make_runner

    def make_runner(pipeline, source, config, **kwargs):
        if config.cut == spec.all_cpu:
            return make(pipeline, source, dataclasses.replace(config, device=cpu), **kwargs)
        real = make(pipeline, source, dataclasses.replace(config, cut=spec.all_cpu, device=cpu), **kwargs)
        return FailingGpuRunner(real, good=2, error=error)

    monkeypatch.setattr(opened_pipeline, "make_runner", make_runner)
    loader = Loader(spec, batch_size=5, placement="gpu", seed=1)
    assert loader.cut == 1 and loader.device.type == "cuda"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = [i for batch in loader for i in batch["index"].tolist()]
    assert sorted(seen) == list(range(len(loader.source)))
    assert loader.cut == spec.all_cpu and len(loader.fallbacks) == 1
    assert any("continuing on the CPU placement" in str(w.message) for w in caught)
    reference = Loader(spec, batch_size=5, placement="cpu", seed=1)
    assert seen == [i for batch in reference for i in batch["index"].tolist()]


def test_data_errors_and_bugs_are_not_gpu_failures():
    assert not is_gpu_failure(ValueError("image data is corrupt"))
    assert not is_gpu_failure(RuntimeError("shape mismatch"))
    assert is_gpu_failure(torch.cuda.OutOfMemoryError("x"))


# What DALI raises when the GPU fails under a GPU placement (texts as DALI prints them).
DALI_GPU_FAILURES = [
    "Critical error in pipeline:\nError when executing Mixed operator ImageDecoder encountered:\nCUDA allocation "
    "failed\nCurrent pipeline object is no longer valid.",
    "Critical error in pipeline:\nError when executing Mixed operator ImageDecoder encountered:\nCan't allocate "
    "129499136 bytes on device 0.\nCurrent pipeline object is no longer valid.",
    'Critical error in pipeline:\nError in MIXED operator `nvidia.dali.fn.decoders.image`,\nencountered:\n\n'
    'NVJPEG error "5" : NVJPEG_STATUS_ALLOCATOR_FAILURE\nCurrent pipeline object is no longer valid.',
    "Critical error in pipeline:\nError in GPU operator `nvidia.dali.fn.resize`,\nencountered:\n\nCUDA runtime API "
    "error cudaErrorIllegalAddress (700):\nan illegal memory access was encountered\nCurrent pipeline object is no "
    "longer valid.",
]


class FailingPipeline:
    """A real DALI pipeline whose ``outputs()`` raises ``message`` (as DALI does) once ``after`` batches came."""

    def __init__(self, pipe, after: int, message: str):
        self.pipe, self.after, self.message = pipe, after, message

    def outputs(self):
        if self.after == 0:
            raise RuntimeError(self.message)
        self.after -= 1
        return self.pipe.outputs()

    def __getattr__(self, name):
        return getattr(self.pipe, name)


def failing_at_dali(runner, message: str, after: int = 0, at_build: bool = False):
    """Make ``runner``'s DALI pipeline fail with ``message``: when it is built, or on ``outputs()``."""
    real = runner.session.pipeline

    def pipeline():
        if at_build:
            raise RuntimeError(message)
        return FailingPipeline(real(), after, message)

    runner.session.pipeline = pipeline
    return runner


@pytest.mark.parametrize("message", DALI_GPU_FAILURES)
def test_a_gpu_failure_inside_dali_comes_out_as_itself(image_dir, message):
    from runners import image_runner
    from feedline.loader.sampler import EpochSampler

    runner = failing_at_dali(image_runner(image.val(image_dir, size=32), batch_size=4), message, after=1)
    plans = EpochSampler(37, 4, shuffle=False).epoch(0)
    stream = runner.batches(iter(plans))
    next(stream)
    with pytest.raises(RuntimeError) as info:
        next(stream)
    assert str(info.value) == message and is_gpu_failure(info.value)
    assert not isinstance(info.value, ValueError)  # not turned into a DataError


def test_a_corrupt_file_is_still_a_data_error_whatever_dali_says(tmp_path):
    from conftest import write_images
    from corrupt_images import payload
    from runners import image_runner
    from feedline.loader import DataError
    from feedline.loader.sampler import EpochSampler

    write_images(tmp_path, 6, classes=1, seed=3)
    bad = tmp_path / "class_0" / "img_0002.jpg"
    bad.write_bytes(payload("truncated", seed=1))
    message = ('Critical error in pipeline:\nError in MIXED operator `nvidia.dali.fn.decoders.image`,\n'
               'encountered:\n\nnvJPEG error "6": NVJPEG_STATUS_EXECUTION_FAILED\nCurrent pipeline object is no '
               'longer valid.')
    runner = failing_at_dali(image_runner(image.val(tmp_path, size=32), batch_size=6), message)
    with pytest.raises(DataError) as info:
        next(runner.batches(iter(EpochSampler(6, 6, shuffle=False).epoch(0))))
    assert info.value.where == str(bad)


@pytest.mark.parametrize("at_build", [True, False])
@pytest.mark.parametrize("message", DALI_GPU_FAILURES[::3])
def test_the_loader_falls_back_when_dali_fails_on_the_gpu(image_dir, monkeypatch, message, at_build):
    """The Loader runs a GPU placement whose DALI pipeline fails with DALI's own message, at build time or
    mid-epoch; it moves to the CPU and delivers every sample exactly once, in the CPU placement's order."""
    spec = image.train(image_dir, size=32, output="uint8")
    cpu = as_if_on_a_gpu(monkeypatch)
    make = opened_pipeline.make_runner

    def make_runner(pipeline, source, config, **kwargs):
        runner = make(pipeline, source, dataclasses.replace(config, cut=spec.all_cpu, device=cpu), **kwargs)
        return runner if config.cut == spec.all_cpu else failing_at_dali(runner, message, 2, at_build)

    monkeypatch.setattr(opened_pipeline, "make_runner", make_runner)
    loader = Loader(spec, batch_size=5, placement="gpu", seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = [(b["index"].tolist(), b["image"]) for b in loader]
    reference = [(b["index"].tolist(), b["image"]) for b in Loader(spec, batch_size=5, placement="cpu", seed=1)]
    assert [i for i, _ in batches] == [i for i, _ in reference]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(batches, reference, strict=True))
    assert loader.cut == spec.all_cpu and len(loader.fallbacks) == 1
    assert any("continuing on the CPU placement" in str(w.message) for w in caught)
