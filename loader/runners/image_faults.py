"""Which sample a failed DALI batch is at fault for: DALI's CPU decoder decides, one file at a time; the image
library only words the reason."""
from __future__ import annotations

import io
import re

import numpy as np
from PIL import Image

from ..errors import DataError
from ..sources.image_files import ImageFiles
from .image_batches import HostBatch, Sample

_FAILED_SAMPLE = re.compile(r"Failed to decode sample #(\d+)")


def sample_at_fault(source: ImageFiles, batch: HostBatch, exc: RuntimeError, ask_dali: bool = True
                    ) -> tuple[Sample | None, DataError]:
    """The sample ``batch`` failed for (``exc``, DALI's error): the first that DALI's CPU decoder refuses on its
    own, with a DataError naming it; else None, with a DataError naming the batch. Without ``ask_dali`` (the
    message says the GPU failed), only a file the image library cannot decode either is blamed."""
    paths = [source.where(s.index) for s in batch.good]
    match = _FAILED_SAMPLE.search(str(exc))
    suspects = [int(match.group(1))] if match and int(match.group(1)) < len(paths) else range(len(paths))
    decoder = _OneByOne() if ask_dali else None
    for k in suspects:
        data = source.read(batch.good[k].index)
        why = _pil_refuses(data)
        if decoder.decodes(data) if decoder is not None else why is None:
            continue
        if why is not None:
            return batch.good[k], DataError(paths[k], f"image data is corrupt or truncated and cannot be "
                                                      f"decoded ({why})")
        return batch.good[k], DataError(paths[k], "image data is corrupt and the decoder rejects it")
    last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    return None, DataError(f"batch of {len(paths)} files from {paths[0]}", f"DALI failed: {last}")


def _pil_refuses(data: np.ndarray) -> str | None:
    """Why the image library cannot decode these bytes, or None when it can."""
    try:
        with Image.open(io.BytesIO(data.tobytes())) as im:
            im.load()
        return None
    except Exception as err:
        return str(err) or type(err).__name__


class _OneByOne:
    """DALI's CPU decoder on one file at a time, the pipeline made again after each failure (which leaves a
    DALI pipeline unusable)."""

    def __init__(self):
        self._pipe = None
        self._data = None

    def decodes(self, data: np.ndarray) -> bool:
        from nvidia.dali import Pipeline, fn, types

        self._data = data
        if self._pipe is None:
            pipe = Pipeline(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1)
            with pipe:
                pipe.set_outputs(fn.decoders.image(fn.external_source(source=lambda: [self._data], batch=True,
                                                                      dtype=types.UINT8, ndim=1),
                                                   output_type=types.RGB))
            pipe.build()
            self._pipe = pipe
        try:
            self._pipe.run()
            return True
        except RuntimeError:
            self._pipe = None
            return False
