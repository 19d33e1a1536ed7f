"""The opened sources of a mix, the one index space their samples share, and a plan over it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...pipelines.mix import MixSpec
from ..sampler import BatchPlan


@dataclass(frozen=True)
class MixPlan(BatchPlan):
    """A plan of mix indices that also says, per sample, its source, its index there and the source's own
    epoch (which keys the sample's augmentation)."""

    sources: np.ndarray | None = None
    source_epochs: np.ndarray | None = None
    local: np.ndarray | None = None


def part_seed(seed: int, part: int) -> int:
    """The seed of source ``part``'s own order and augmentation: distinct per source, fixed by the Loader's."""
    return int(np.random.SeedSequence([seed, part]).generate_state(1, np.uint32)[0])


class MixedSources:
    """Each source of a mix opened as on its own (``parts``, in ``names`` order). A sample's index in the mix is
    its index in its source plus ``offsets[source]`` (the sizes of the sources before it)."""

    def __init__(self, spec: MixSpec, open_one):
        self.names = spec.names
        self.parts = tuple(open_one(part.source) for part in spec.parts)
        self.sizes = np.array([len(p) for p in self.parts], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.sizes.sum())

    def source_of(self, index) -> np.ndarray:
        """The source number of each mix index."""
        return np.searchsorted(self.offsets, np.asarray(index, dtype=np.int64), side="right") - 1

    def __repr__(self) -> str:
        return f"MixedSources({dict(zip(self.names, self.sizes.tolist()))})"
