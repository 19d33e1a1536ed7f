"""The Criteo readers feedline's benchmarks time, in one place: the bench itself, the side processes of the
baseline comparisons and the kernel warm-up that runs them before any clock starts open the same Loaders."""
from __future__ import annotations

from ..loader.cache_policy import CacheSettings
from ..loader.devices import gpu_available
from ..loader.loader import Loader
from ..pipelines.criteo import criteo
from .side_process import Opened

# Buckets every benchmark hashes the ids into (a prime, as the DLRM reference's % n; a 1M-row table per feature).
TABLE_SIZE = 1_000_003


def open_loader(path: str, batch_size: int, placement: str = "cpu", *, shuffle: bool = True,
                num_threads: int | None = None, cache: CacheSettings | str = "auto", last_batch: str = "partial",
                table_size: int | None = TABLE_SIZE) -> Loader:
    """The benchmark's Loader over the Criteo data at ``path`` (ids hashed into ``table_size`` buckets, None:
    criteo's default; rows shuffled with seed 0; ``placement`` other than cpu on the GPU where one is usable)."""
    device = "cuda" if placement != "cpu" and gpu_available() else "cpu"
    return Loader(criteo(path, table_sizes=table_size), batch_size, placement=placement, device=device,
                  shuffle=shuffle, seed=0, num_threads=num_threads, cache=cache, last_batch=last_batch)


def open_feedline(path: str, batch_size: int, table_size: int, seed: int = 0) -> Opened:
    """feedline's Loader over a TSV or a converted folder, CPU placement, rows shuffled with ``seed``. A TSV is
    parsed every epoch (``cache="off"``): this side measures parsing; the table cache, which makes the epochs
    after the first read a converted form, is measured by ``table_cache_bench``."""
    loader = Loader(criteo(path, table_sizes=table_size), batch_size, placement="cpu", shuffle=True, seed=seed,
                    cache="off")
    return Opened(make=lambda: loader, readahead=loader.prefetch, close=loader.close,
                  facts={"shuffle_buffer": loader.shuffle_buffer})
