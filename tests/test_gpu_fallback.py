"""A GPU that fails mid-epoch (out of memory, lost device) sends the Loader to the CPU placement without
losing or repeating a sample. The failure is injected: a stand-in runner plays the GPU placement."""
import dataclasses
import warnings

import pytest
import torch

from feedline.loader import Loader, loader as loader_module
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


@pytest.mark.parametrize("error", [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("CUDA error: an illegal memory access was encountered"),
    RuntimeError("nvJPEG error: device lost"),
])
def test_gpu_failure_falls_back_to_cpu_without_losing_a_batch(image_dir, monkeypatch, error):
    spec = image.train(image_dir, size=32, output="uint8")
    monkeypatch.setattr(loader_module, "gpu_available", lambda: True)
    make = Loader._runner_for
    cpu = torch.device("cpu")

    def runner_for(self, config):
        if config.cut == spec.all_cpu:
            return make(self, dataclasses.replace(config, device=cpu))
        real = make(self, dataclasses.replace(config, cut=spec.all_cpu, device=cpu))
        return FailingGpuRunner(real, good=2, error=error)

    monkeypatch.setattr(Loader, "_runner_for", runner_for)
    loader = Loader(spec, batch_size=5, placement="gpu", seed=1)
    assert loader.cut == 1 and loader.device.type == "cuda"
    loader.device = cpu  # no GPU here to deliver to (nor a CUDA stream to make batches on)
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
