"""Every image stage's parameters for a batch of samples (a crop window, a flip, jitter factors), drawn from each
sample's counter-based random stream (``counter_rng``) and the sizes its image has on the way through the stages.
A sample's parameters are a pure function of (seed, epoch, index, its image's size): the same on every placement,
for every batch size, and after a resume."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .counter_rng import uniform
from .imaging.base import ImageStage

EXAMPLE_SIZE = 256  # the image size of ``StageParams.example``


class StageParams:
    """The parameter drawing of ``stages``, the image stages of a pipeline (decode first). Each stage's draws
    take their own columns of a sample's stream, in stage order. Where the decoder can decode only a window
    and the stage after it starts by cropping one, the decoder takes that crop over (``decoder_crops``): the
    window is drawn as before and moves to the decoder's parameters."""

    def __init__(self, stages: Sequence[ImageStage]):
        self.stages = tuple(stages)
        self.offsets = tuple(int(x) for x in np.cumsum([0] + [s.draws for s in self.stages])[:-1])
        self.draws = sum(s.draws for s in self.stages)
        self.decoder_crops = bool(getattr(self.stages[0], "roi", False) and len(self.stages) > 1
                                  and self.stages[1].crops_first)

    def draw(self, seed: int, epoch: int, indices: np.ndarray, sizes: np.ndarray) -> tuple[list[dict], list[float]]:
        """Per image stage, its parameters (name -> one row per sample) and the mean pixels of its output,
        for the samples ``indices`` of ``epoch`` whose images are ``sizes`` (int64 [n, 2] of width, height)."""
        u = uniform(seed, epoch, indices, self.draws) if self.draws else np.zeros((indices.size, 0))
        params, pixels = [], []
        for stage, offset in zip(self.stages, self.offsets):
            p, sizes = stage.sample(u[:, offset:offset + stage.draws], sizes)
            params.append(dict(p))
            pixels.append(float(sizes.prod(axis=1).mean()))
        if self.decoder_crops:  # so the stage after the decoder only resizes
            params[0]["window"] = window = params[1].pop("window")
            pixels[0] = float(window[:, 2:].astype(np.int64).prod(axis=1).mean())
        return params, pixels

    def example(self) -> list[dict]:
        """One sample's parameters for an image of ``EXAMPLE_SIZE`` pixels square: the kinds of values every
        batch's parameters have."""
        sizes = np.full((1, 2), EXAMPLE_SIZE, dtype=np.int64)
        return self.draw(0, 0, np.zeros(1, dtype=np.int64), sizes)[0]
