"""Criteo rows per second: feedline end to end (torch tensors in hand) against the preprocessing a user writes
today in the style of the DLRM reference (pandas ``read_csv``, then a Python ``int(x, 16) % n`` per
categorical value and ``log1p`` of the clipped dense columns), producing the same outputs.

Both sides deliver, per batch: float32 ``label`` [B], float32 ``dense`` [B, 13], and the 26 categorical ids in
key-major ``values``/``lengths``/``offsets`` form. The baseline maps ids with ``% n`` instead of MurmurHash3,
which only flatters it (a Python hash per value would cost more).
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch

from ..loader.loader import Loader
from ..pipelines.criteo import CATEGORICAL_NAMES, DENSE_NAMES, criteo

TABLE_SIZE = 1_000_003
WARMUP_BATCHES = 2


def bench_criteo(path: str | os.PathLike, batch_size: int = 8192, batches: int | None = None,
                 placement: str = "cpu", *, baseline: bool = True, shuffle: bool = True,
                 num_threads: int | None = None, baseline_rows: int | None = None) -> dict:
    """Measure feedline and (``baseline``) the pandas baseline on the file at ``path``.

    ``batches``: timed batches after a short warm-up (None: one whole epoch, no warm-up, opening included in
    ``feedline_first_epoch_samples_per_s``). ``baseline_rows``: rows the baseline reads (None: all of them; its
    cost per row does not depend on the count, so fewer rows give the same rate sooner).
    """
    path = os.fspath(path)
    device = "cuda" if placement != "cpu" and torch.cuda.is_available() else "cpu"
    began = time.perf_counter()
    spec = criteo(path, table_sizes=TABLE_SIZE)
    loader = Loader(spec, batch_size, placement=placement, device=device, shuffle=shuffle, seed=0,
                    num_threads=num_threads)
    open_s = time.perf_counter() - began
    result = {"pipeline": "criteo", "placement": placement, "batch_size": batch_size, "shuffle": shuffle,
              "num_threads": loader.num_threads, "open_s": round(open_s, 3)}
    try:
        rows, seconds = _time_loader(loader, batches, device)
    finally:
        loader.close()
    result["rows"] = rows
    result["feedline_samples_per_s"] = rows / seconds
    if batches is None:
        result["feedline_first_epoch_samples_per_s"] = rows / (seconds + open_s)
    if baseline:
        base_rows, base_seconds = _time_baseline(path, batch_size, baseline_rows)
        result["baseline_rows"] = base_rows
        result["baseline_samples_per_s"] = base_rows / base_seconds
        result["speedup"] = result["feedline_samples_per_s"] / result["baseline_samples_per_s"]
        if batches is None:
            result["speedup_first_epoch"] = (result["feedline_first_epoch_samples_per_s"]
                                             / result["baseline_samples_per_s"])
    return result


def _time_loader(loader: Loader, batches: int | None, device: str) -> tuple[int, float]:
    stream = iter(loader)
    if batches is not None:
        for _ in zip(range(WARMUP_BATCHES), stream):
            pass
    rows, began = 0, time.perf_counter()
    for i, batch in enumerate(stream):
        rows += batch["label"].shape[0]
        if batches is not None and i + 1 >= batches:
            break
    if device == "cuda":
        torch.cuda.synchronize()
    return rows, time.perf_counter() - began


def pandas_features(path: str, nrows: int | None = None, table_size: int | None = TABLE_SIZE
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The baseline's features, as a user writes them with pandas today: ``read_csv`` (hex ids read as Python
    strings: ``object`` is what ``.map`` walks fastest), per categorical column ``fillna`` + ``.map(int(x, 16))``
    + ``% table_size`` (None: the ids themselves; a missing id is ``int("-1", 16)``, which is feedline's
    ``MISSING_ID``), and ``log1p`` of the dense columns with missing values as 0 and negatives clipped to 0.
    Returns float32 ``label`` [N], float32 ``dense`` [N, 13] and int64 ``ids`` [N, 26]."""
    import pandas as pd

    names = ["label", *DENSE_NAMES, *CATEGORICAL_NAMES]
    df = pd.read_csv(path, sep="\t", header=None, names=names, nrows=nrows,
                     dtype={name: object for name in CATEGORICAL_NAMES})
    for name in CATEGORICAL_NAMES:
        ids = df[name].fillna("-1").map(lambda x: int(x, 16))
        df[name] = ids if table_size is None else ids % table_size
    dense = np.log1p(df[list(DENSE_NAMES)].fillna(0).clip(lower=0).to_numpy(dtype=np.float32))
    ids = df[list(CATEGORICAL_NAMES)].to_numpy(dtype=np.int64)
    label = df["label"].to_numpy(dtype=np.float32)
    return label, dense, ids


def _time_baseline(path: str, batch_size: int, nrows: int | None) -> tuple[int, float]:
    began = time.perf_counter()
    label, dense, ids = pandas_features(path, nrows)
    for start in range(0, len(label), batch_size):
        rows = slice(start, start + batch_size)
        values = torch.from_numpy(np.ascontiguousarray(ids[rows].T).reshape(-1))
        lengths = torch.ones(values.numel(), dtype=torch.int32)
        _ = (torch.from_numpy(label[rows]), torch.from_numpy(dense[rows]), values, lengths,
             torch.arange(values.numel() + 1, dtype=torch.int64))
    return len(label), time.perf_counter() - began
