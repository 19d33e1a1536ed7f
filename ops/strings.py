"""``Strings``: a batch of UTF-8 strings as Arrow-style ``offsets`` + ``data`` (NumPy or CuPy)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ._arrays import array_module
from ._checks import offsets_array


@dataclass(frozen=True)
class Strings:
    """String i is ``data[offsets[i]:offsets[i + 1]]``.

    ``offsets``: int32 or int64, length n + 1, non-decreasing, within ``[0, len(data)]`` (it need not
    start at 0, as in a sliced Arrow array). ``data``: uint8 bytes, UTF-8 for text. Construction
    validates and stores ``offsets`` as int64.
    """

    offsets: object
    data: object

    def __post_init__(self) -> None:
        xp = array_module(offsets=self.offsets, data=self.data)
        data = xp.asarray(self.data)
        if data.dtype != np.uint8 or data.ndim != 1:
            raise TypeError(
                f"data must be a 1-D uint8 array, got dtype {data.dtype} with shape {data.shape}"
            )
        offsets = offsets_array("offsets", self.offsets, data.shape[0], "data", xp)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "offsets", offsets)

    def __len__(self) -> int:
        return self.offsets.shape[0] - 1

    def slice(self, start: int, stop: int) -> Strings:
        """Strings ``start`` to ``stop`` (exclusive), sharing ``data``."""
        return Strings(self.offsets[start : stop + 1], self.data)

    @classmethod
    def from_pylist(cls, items: Sequence[str | bytes]) -> Strings:
        """From Python ``str`` (encoded as UTF-8) or ``bytes`` items."""
        encoded = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                encoded.append(item.encode("utf-8"))
            elif isinstance(item, (bytes, bytearray)):
                encoded.append(bytes(item))
            else:
                raise TypeError(f"items[{i}] must be str or bytes, got {type(item).__name__}")
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        return cls(offsets, data)

    @classmethod
    def from_arrow(cls, array) -> Strings:
        """From a pyarrow string/binary array (large or not, chunked or not), without copying data."""
        pa = _arrow_of(array)
        if pa is None or not isinstance(array, (pa.Array, pa.ChunkedArray)):
            raise TypeError(f"array must be a pyarrow Array or ChunkedArray, got {type(array).__name__}")
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        offset_dtypes = {
            pa.string(): np.int32,
            pa.binary(): np.int32,
            pa.large_string(): np.int64,
            pa.large_binary(): np.int64,
        }
        if array.type not in offset_dtypes:
            raise TypeError(
                f"array must have type string, large_string, binary or large_binary, got {array.type}"
            )
        if array.null_count:
            raise ValueError(f"array must not contain nulls, got {array.null_count} nulls; fill them first")
        _, offsets_buffer, data_buffer = array.buffers()
        offsets = np.frombuffer(offsets_buffer, dtype=offset_dtypes[array.type])
        offsets = offsets[array.offset : array.offset + len(array) + 1]
        data = (
            np.frombuffer(data_buffer, dtype=np.uint8)
            if data_buffer is not None
            else np.zeros(0, dtype=np.uint8)
        )
        return cls(offsets, data)


def as_strings(values) -> Strings | None:
    """``values`` as ``Strings`` when it is one, a pyarrow string array or a list of str; else None."""
    if isinstance(values, Strings):
        return values
    pa = _arrow_of(values)
    if pa is not None and isinstance(values, (pa.Array, pa.ChunkedArray)) and _is_arrow_bytes(values.type, pa):
        return Strings.from_arrow(values)
    if isinstance(values, (list, tuple)) and values and isinstance(values[0], (str, bytes)):
        return Strings.from_pylist(values)
    return None


def _arrow_of(value):
    """pyarrow when ``value`` is one of its objects, else None. Never imports pyarrow for other values; and
    never returns it half-imported (``sys.modules`` would, while another thread imports it)."""
    if not type(value).__module__.startswith("pyarrow"):
        return None
    import pyarrow

    return pyarrow


def _is_arrow_bytes(arrow_type, pa) -> bool:
    return any(
        check(arrow_type)
        for check in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)
    )
