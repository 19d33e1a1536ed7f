"""Building runners directly in tests, over a freshly opened source."""
import torch

from feedline.loader.runners import RunnerConfig
from feedline.loader.runners.feature_runner import FeatureRunner
from feedline.loader.runners.image_runner import ImageRunner
from feedline.loader.sources import open_source


def feature_runner(spec, cut=None, device="cpu", *, prefetch=2, num_threads=1, source=None):
    config = RunnerConfig(spec.all_cpu if cut is None else cut, torch.device(device), batch_size=1,
                          num_threads=num_threads, prefetch=prefetch)
    return FeatureRunner(spec, source or open_source(spec.source), config)


def image_runner(spec, cut=None, device="cpu", *, batch_size, seed=0, num_threads=1, prefetch=2, gpu=None, **kw):
    config = RunnerConfig(spec.all_cpu if cut is None else cut, torch.device(device), batch_size, seed,
                          num_threads, prefetch, **kw)
    return ImageRunner(spec, open_source(spec.source), config, gpu=gpu)


def batches(runner, plans):
    """The runner's batches for ``plans`` (each made from one plan), without their BatchInfo."""
    return [b for b, _ in runner.batches(iter(plans))]
