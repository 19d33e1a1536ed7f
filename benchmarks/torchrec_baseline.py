"""TorchRec's own DLRM data path, as its users run it, for ``feedline bench --pipeline criteo --baseline torchrec``.

Conversion, once: ``torchrec.datasets.criteo.BinaryCriteoUtils.tsv_to_npys`` reads the TSV line by line in
Python (every field through ``int()``, all rows held as lists) and writes three ``.npy`` files: dense float32
[N, 13] (``log(x - min + 2)``, the minimum taken over the whole file, a missing count as 0), sparse int64 [N, 26]
(``int(hex, 16)``, a missing id as 0) and labels int32 [N, 1].

Epochs: ``InMemoryBinaryCriteoIterDataPipe`` loads the three files whole into memory and takes every id modulo
its table size once, in place, when it is constructed (``hashes``); each epoch then walks the rows in file order
in contiguous batches. ``shuffle_batches=True`` permutes the rows *inside* each batch: the batches come in the
same order every epoch and always hold the same rows. It is wrapped, as TorchRec's DLRM example does
(``examples/dlrm/data/dlrm_dataloader.py``), in ``DataLoader(dataset, batch_size=None, collate_fn=identity)``
with no workers, so each ``Batch`` (dense float32 [B, 13], a ``KeyedJaggedTensor`` of the 26 ids, int32 labels)
is made on the iterating thread.

Run as a command, it converts: ``python -m feedline.benchmarks.torchrec_baseline IN.tsv FOLDER REPORT.json``
(the report holds ``seconds``, the conversion's own time).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from .side_process import Opened

KINDS = ("dense", "sparse", "labels")
NOTES = (
    "TorchRec: DataLoader(InMemoryBinaryCriteoIterDataPipe(stage='train', shuffle_batches=True, hashes=[table]*26), "
    "batch_size=None), no workers, as its DLRM example; batches are made on the iterating thread",
    "TorchRec's shuffle_batches permutes the rows inside each batch; the batches themselves come in file order "
    "and hold the same rows every epoch. feedline shuffles rows across the file (chunks permuted, then a "
    "65,536-row shuffle buffer)",
    "TorchRec takes ids modulo the table size once, when the dataset is constructed (its open_s); feedline "
    "hashes every id with MurmurHash3 in every epoch",
    "TorchRec holds the whole dataset in memory (its peak_rss_mb grows with the file); feedline streams",
    "TorchRec's conversion maps missing counts and ids to 0 and writes log(x - min + 2); feedline keeps missing "
    "values apart (log1p of clipped counts, a missing id hashed as -1): the same work per value, not the same "
    "numbers",
)


def npy_paths(folder: str | os.PathLike) -> dict[str, str]:
    """The three ``.npy`` files of a conversion in ``folder``, by kind."""
    return {kind: os.path.join(os.fspath(folder), f"criteo_{kind}.npy") for kind in KINDS}


def convert(tsv: str | os.PathLike, folder: str | os.PathLike) -> dict:
    """``tsv_to_npys`` of ``tsv`` into ``folder`` (created); returns ``seconds`` and the files' ``bytes_out``."""
    from torchrec.datasets.criteo import BinaryCriteoUtils

    os.makedirs(folder, exist_ok=True)
    paths = npy_paths(folder)
    began = time.perf_counter()
    BinaryCriteoUtils.tsv_to_npys(os.fspath(tsv), paths["dense"], paths["sparse"], paths["labels"])
    seconds = time.perf_counter() - began
    return {"seconds": seconds, "bytes_out": sum(os.path.getsize(p) for p in paths.values())}


def _identity(batch):
    return batch


def open_torchrec(folder: str, batch_size: int, table_size: int) -> Opened:
    """The converted files of ``folder`` as TorchRec's users read them; each batch is handed over as
    ``(labels, Batch)`` so that the benchmark counts its rows by the labels."""
    from torch.utils.data import DataLoader
    from torchrec.datasets.criteo import CAT_FEATURE_COUNT, InMemoryBinaryCriteoIterDataPipe

    paths = npy_paths(folder)
    dataset = InMemoryBinaryCriteoIterDataPipe("train", [paths["dense"]], [paths["sparse"]], [paths["labels"]],
                                               batch_size=batch_size, rank=0, world_size=1, shuffle_batches=True,
                                               hashes=[table_size] * CAT_FEATURE_COUNT)
    loader = DataLoader(dataset, batch_size=None, collate_fn=_identity)
    return Opened(make=lambda: ((batch.labels, batch) for batch in loader), readahead=0)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m feedline.benchmarks.torchrec_baseline IN.tsv FOLDER REPORT.json", file=sys.stderr)
        return 2
    tsv, folder, report = argv
    Path(report).write_text(json.dumps(convert(tsv, folder)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
