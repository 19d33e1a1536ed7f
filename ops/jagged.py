"""``Jagged`` (one sparse feature) and ``keyed_jagged`` (several, in TorchRec key-major layout)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ._arrays import array_module
from ._native import kernels


@dataclass(frozen=True)
class Jagged:
    """Rows of variable length: row i is ``values[offsets[i]:offsets[i + 1]]``.

    ``values`` int64, ``lengths`` int32 (one per row), ``offsets`` int64 = [0, cumsum(lengths)].
    ``values``/``offsets`` suit ``nn.EmbeddingBag``; with several features concatenated by
    ``keyed_jagged`` the three arrays are TorchRec ``KeyedJaggedTensor`` fields.
    """

    values: object
    lengths: object
    offsets: object

    def __post_init__(self) -> None:
        xp = array_module(values=self.values, lengths=self.lengths, offsets=self.offsets)
        for name, dtype in (("values", np.int64), ("lengths", np.int32), ("offsets", np.int64)):
            array = getattr(self, name)
            if not isinstance(array, xp.ndarray) or array.dtype != dtype or array.ndim != 1:
                raise TypeError(
                    f"{name} must be a 1-D {np.dtype(dtype).name} array, got "
                    f"{type(array).__name__} {getattr(array, 'dtype', '')} {getattr(array, 'shape', '')}"
                )
        if self.offsets.shape[0] != self.lengths.shape[0] + 1:
            raise ValueError(
                f"offsets must have len(lengths) + 1 = {self.lengths.shape[0] + 1} entries, "
                f"got {self.offsets.shape[0]}"
            )

    @property
    def num_rows(self) -> int:
        return self.lengths.shape[0]

    @classmethod
    def of_checked(cls, values, lengths, offsets) -> "Jagged":
        """A ``Jagged`` of ``lengths`` and ``offsets`` that are already known to be right (as ``__post_init__``
        checks them: a stage's own constants, say), ``values`` checked here in a few attribute looks (NumPy int64,
        1-D): for every batch, where the full checks take a dozen Python calls. Anything else is checked fully."""
        if type(values) is not np.ndarray or values.dtype != np.int64 or values.ndim != 1 \
                or type(lengths) is not np.ndarray or type(offsets) is not np.ndarray:
            return cls(values, lengths, offsets)
        jagged = object.__new__(cls)
        object.__setattr__(jagged, "values", values)
        object.__setattr__(jagged, "lengths", lengths)
        object.__setattr__(jagged, "offsets", offsets)
        return jagged


def offsets_from_lengths(lengths, xp):
    offsets = xp.zeros(lengths.shape[0] + 1, dtype=np.int64)
    xp.cumsum(lengths, dtype=np.int64, out=offsets[1:])
    return offsets


def one_per_row(lengths, offsets) -> None:
    """Fill ``lengths`` (int32 [n]) with 1 and ``offsets`` (int64 [n + 1]) with 0..n: the layout of keys with
    one value per row (NumPy or CuPy, written in place)."""
    xp = array_module(lengths=lengths, offsets=offsets)
    if offsets.shape[0] != lengths.shape[0] + 1:
        raise ValueError(f"offsets must have len(lengths) + 1 = {lengths.shape[0] + 1} entries, got {offsets.shape[0]}")
    native = kernels("jagged") if xp is np else None
    if native is not None:
        native.one_per_row(lengths, offsets)
        return
    lengths.fill(1)
    offsets[...] = xp.arange(offsets.shape[0], dtype=np.int64)


def keyed_jagged(features: Sequence[Jagged]) -> Jagged:
    """Concatenate features key-major: every row of feature 0, then every row of feature 1, ...

    All features need the same number of rows (TorchRec's stride). ``lengths`` are concatenated,
    ``values`` likewise, and ``offsets`` recomputed as [0, cumsum(lengths)].
    """
    features = list(features)
    if not features:
        raise ValueError("features must contain at least one Jagged, got an empty sequence")
    for i, feature in enumerate(features):
        if not isinstance(feature, Jagged):
            raise TypeError(f"features[{i}] must be a Jagged, got {type(feature).__name__}")
        if feature.num_rows != features[0].num_rows:
            raise ValueError(
                f"features must all have the same number of rows; features[0] has "
                f"{features[0].num_rows}, features[{i}] has {feature.num_rows}"
            )
        if int(feature.offsets[-1]) - int(feature.offsets[0]) != feature.values.shape[0]:
            raise ValueError(
                f"features[{i}] is inconsistent: offsets span {int(feature.offsets[-1]) - int(feature.offsets[0])} "
                f"values but values has {feature.values.shape[0]}"
            )
    xp = array_module(**{f"features[{i}].values": f.values for i, f in enumerate(features)})
    values = xp.concatenate([f.values for f in features])
    lengths = xp.concatenate([f.lengths for f in features])
    return Jagged(values, lengths, offsets_from_lengths(lengths, xp))
