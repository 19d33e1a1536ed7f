"""Making batches for one placement: images on DALI and torch, features on NumPy and CuPy."""
from __future__ import annotations

from ...pipelines.spec import PipelineSpec
from ..cache_policy import CacheMode
from ..skip_log import SkipLog
from ..sources import ImageFiles
from .contract import BatchInfo, Runner, RunnerConfig, StageTimes


def make_runner(spec: PipelineSpec, source, config: RunnerConfig, *, skips: SkipLog | None = None,
                caches=None) -> Runner:
    """The runner for ``spec`` over its opened ``source`` (``feedline.loader.sources.open_source``). The images
    it leaves out go to ``skips`` (default: a log of its own); a table's bad rows go to its source's log, given
    when the source was opened. ``caches``: the Loader's image stores (``ImageCaches``), where
    ``config.cache`` allows one (None: nothing cached)."""
    if isinstance(source, ImageFiles) and caches is not None and config.cache.mode is not CacheMode.OFF:
        from .image_cache import OUTPUT, cache_kind
        # A whole deterministic output is kept as it is made; decoded images only when asked for (cache="on"):
        # filling them decodes whole images instead of the crop window (the first epoch ~1.6x slower), a cost
        # paid before it is known whether the images fit.
        if config.cache.mode is CacheMode.ON or cache_kind(spec.stages[1:]) == OUTPUT:  # (after the read)
            from .image_cache_runner import CachedImageRunner
            return CachedImageRunner(spec, source, config, caches, skips=skips)
        caches.note_not_cached("not cached: decoded training images are kept only with cache='on' (filling the "
                               "cache decodes whole images, not only each crop, so the first epoch is slower, "
                               "before it is known whether they fit)")
    if isinstance(source, ImageFiles):
        from .image_runner import ImageRunner
        return ImageRunner(spec, source, config, skips=skips)
    from .feature_runner import FeatureRunner
    return FeatureRunner(spec, source, config)


__all__ = ["make_runner", "BatchInfo", "Runner", "RunnerConfig", "StageTimes"]
