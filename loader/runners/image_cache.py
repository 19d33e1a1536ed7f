"""Where an image pipeline's cached samples are kept: what may be cached (``cacheable_prefix``), under which key
(``cache_key``: the source's files and the prefix's definition), and the stores (RAM within a byte budget, or
records in a memory-mapped file under the cache's directory, which later runs reuse).

A disk store is written to temporary files and moved into place in one step once it holds every sample of the
source (the bad ones listed with their reasons), so a reader finds a whole store or none."""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from dataclasses import dataclass

import numpy as np

from ...pipelines.imaging.base import ImageStage
from ...pipelines.imaging.custom import Custom
from ...pipelines.spec import PipelineSpec
from ..cache_policy import CacheDecision, CacheMode, CacheSettings, available_bytes, pending

OUTPUT, DECODED = "output", "decoded"
_FORMAT = 1


def cacheable_prefix(stages: tuple[ImageStage, ...]) -> int:
    """How many of the image stages (decode first) come before the first that draws randomness or is a
    ``custom`` stage not declared deterministic: their output is the same every epoch."""
    for k, stage in enumerate(stages):
        if stage.draws > 0 or (isinstance(stage, Custom) and not stage.deterministic):
            return k
    return len(stages)


def cache_kind(stages: tuple[ImageStage, ...]) -> str:
    """``OUTPUT`` where the whole pipeline is deterministic (the batch's images are kept), else ``DECODED``
    (the decoded images are kept and the stages from the decoder's on run every epoch)."""
    return OUTPUT if cacheable_prefix(stages) == len(stages) else DECODED


def _files(source) -> list[str]:
    return list(getattr(source, "shards", None) or source.paths)


def cache_key(spec: PipelineSpec, source, what: str) -> str:
    """The identity of what a store holds: every file of the source (path, size, modification and change
    times, inode: a rewritten file changes it) and ``what`` (the prefix's definition and placement)."""
    h = hashlib.sha256(f"feedline-image-cache {_FORMAT}\n{what}\n".encode())
    for path in source.paths:
        h.update(path.encode("utf-8", "surrogateescape") + b"\0")
    for path in _files(source):
        try:
            st = os.stat(path)
            h.update(f"{st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino}\n".encode())
        except OSError:
            h.update(b"missing\n")
    return h.hexdigest()[:32]


@dataclass
class Record:
    offset: int
    shape: tuple[int, ...]


class RamStore:
    """Samples in RAM, within ``budget`` bytes; past it, ``put`` keeps nothing more and ``overflowed`` says so."""

    where = "RAM"

    def __init__(self, budget: int, dtype: np.dtype):
        self.budget, self.dtype = budget, np.dtype(dtype)
        self.items: dict[int, np.ndarray] = {}
        self.nbytes = 0
        self.overflowed = False
        self.bad: dict[int, tuple[str, str]] = {}  # index -> (where, reason): samples that cannot be made
        self.complete = False
        self.recompute_s: float | None = None  # measured when it was filled (seconds per sample)

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, index: int) -> bool:
        return index in self.items

    def get(self, index: int) -> np.ndarray | None:
        return self.items.get(index)

    def put(self, index: int, array: np.ndarray) -> bool:
        if index in self.items:
            return True
        if self.overflowed or self.nbytes + array.nbytes > self.budget:
            self.overflowed = True
            return False
        self.items[index] = np.ascontiguousarray(array, dtype=self.dtype).copy()
        self.nbytes += array.nbytes
        return True

    def finish(self, samples: int, recompute_s: float | None) -> bool:
        """Marks the store whole if it holds (or lists as bad) every one of ``samples``; whether it does."""
        self.complete = not self.overflowed and len(self.items) + len(self.bad) >= samples
        if self.recompute_s is None:
            self.recompute_s = recompute_s
        return self.complete

    def drop(self) -> None:
        """Lets go of what it holds and keeps nothing more."""
        self.items.clear()
        self.nbytes, self.overflowed = 0, True


class DiskStore(RamStore):
    """Samples as records of one file in ``folder`` (``records.bin``, memory-mapped to read; ``index.npz``
    and ``meta.json`` beside it). A whole store found there is opened for reading; otherwise records are
    appended in a temporary folder of this writer's while the first epoch runs, renamed to ``folder`` by
    ``finish`` (where another writer got there first, its store is used)."""

    def __init__(self, folder: str, budget: int, dtype: np.dtype):
        super().__init__(budget, dtype)
        self.folder = folder
        self.where = folder
        self.records: dict[int, Record] = {}
        self._map: np.memmap | None = None
        self._out = None
        self._tmp = f".tmp-{os.getpid()}-{secrets.token_hex(4)}"
        self._load()

    def _load(self) -> None:
        try:
            with open(os.path.join(self.folder, "meta.json")) as f:
                meta = json.load(f)
            index = np.load(os.path.join(self.folder, "index.npz"))
            if meta.get("format") != _FORMAT or meta.get("dtype") != self.dtype.str:
                return
            size = os.path.getsize(os.path.join(self.folder, "records.bin"))
            keys, offsets, shapes = index["keys"], index["offsets"], index["shapes"]
            ends = offsets + shapes.prod(axis=1) * self.dtype.itemsize
            if len(keys) and (offsets.min() < 0 or ends.max() > size):
                return  # not ours, or cut short: rebuilt
            self.records = {int(k): Record(int(o), tuple(int(x) for x in s)) for k, o, s in zip(keys, offsets, shapes)}
            self.bad = {int(k): (str(w), str(r)) for k, w, r in meta.get("bad", [])}
            self.recompute_s = meta.get("recompute_s")
            self.nbytes = int(ends.sum() - offsets.sum()) if len(keys) else 0
            self._map = np.memmap(os.path.join(self.folder, "records.bin"), dtype=np.uint8, mode="r") if size else None
            self.complete = True
        except (OSError, ValueError, KeyError, TypeError):
            self.records, self.bad, self.complete = {}, {}, False

    def __len__(self) -> int:
        return len(self.records)

    def __contains__(self, index: int) -> bool:
        return index in self.records

    def get(self, index: int) -> np.ndarray | None:
        record = self.records.get(index)
        if record is None:
            return None
        if self._map is None:
            self._map = np.memmap(self._path("records.bin"), dtype=np.uint8, mode="r")
        n = int(np.prod(record.shape)) * self.dtype.itemsize
        return self._map[record.offset:record.offset + n].view(self.dtype).reshape(record.shape)

    def _path(self, name: str) -> str:
        """A file of the whole store, or while it fills, of this writer's own temporary folder beside it."""
        return os.path.join(self.folder if self.complete else self.folder + self._tmp, name)

    def put(self, index: int, array: np.ndarray) -> bool:
        if index in self.records or self.complete:
            return index in self.records
        if self.overflowed or self.nbytes + array.nbytes > self.budget:
            self.overflowed = True
            return False
        if self._out is None:
            os.makedirs(self.folder + self._tmp, exist_ok=True)
            self._out = open(self._path("records.bin"), "wb")
        offset = self._out.tell()
        self._out.write(np.ascontiguousarray(array, dtype=self.dtype).tobytes())
        self._out.flush()
        self.records[index] = Record(offset, tuple(array.shape))
        self.nbytes += array.nbytes
        self._map = None  # grown: mapped again on the next read
        return True

    def finish(self, samples: int, recompute_s: float | None) -> bool:
        if self.complete:
            return True
        if self.overflowed or len(self.records) + len(self.bad) < samples:
            return False
        if self._out is None:
            os.makedirs(self.folder + self._tmp, exist_ok=True)
            self._out = open(self._path("records.bin"), "wb")
        self._out.close()
        self._out = None
        keys = np.array(sorted(self.records), dtype=np.int64)
        np.savez(self._path("index.npz"), keys=keys,
                 offsets=np.array([self.records[k].offset for k in keys], dtype=np.int64).reshape(-1),
                 shapes=np.array([self.records[k].shape for k in keys], dtype=np.int64).reshape(len(keys), -1))
        meta = {"format": _FORMAT, "dtype": self.dtype.str, "recompute_s": recompute_s,
                "bad": [[k, w, r] for k, (w, r) in sorted(self.bad.items())]}
        with open(self._path("meta.json"), "w") as f:
            json.dump(meta, f)
        try:
            os.rename(self.folder + self._tmp, self.folder)  # one step: readers find a whole store or none
        except OSError:  # another writer (a rank, a run) finished first: use its store
            shutil.rmtree(self.folder + self._tmp, ignore_errors=True)
            self.records, self.bad, self._map = {}, {}, None
            self._load()
            return self.complete
        self.complete, self.recompute_s, self._map = True, recompute_s, None
        return True

    def drop(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None
            shutil.rmtree(self.folder + self._tmp, ignore_errors=True)
        self._map = None
        self.records.clear()
        self.nbytes, self.overflowed = 0, True


class ImageCaches:
    """A Loader's image stores, kept across the runners it replaces (one store at a time: a new placement's
    key drops the old one), and the last decision."""

    def __init__(self, settings: CacheSettings):
        self.settings = settings
        self.stores: dict[str, RamStore] = {}
        self.decisions: dict[str, CacheDecision] = {}
        self.kinds: dict[str, str] = {}
        self.current: str | None = None
        self.why_not: str | None = None  # why the pipeline's images are not cached, where that is decided up front

    def note_not_cached(self, reason: str) -> None:
        self.current, self.why_not = None, reason

    def store(self, key: str, kind: str, dtype) -> RamStore:
        if key not in self.stores:
            for old in self.stores.values():
                old.drop()
            self.stores.clear()
            if self.settings.directory is None:
                self.stores[key] = RamStore(self.settings.memory_bytes, dtype)
            else:
                self.stores[key] = DiskStore(os.path.join(self.settings.directory, key),
                                             available_bytes(self.settings), dtype)
            self.kinds[key] = kind
        self.current = key
        return self.stores[key]

    def report(self) -> dict:
        """The decision now, for ``loader.plan``: what is cached, whether it is used and why, with the figures."""
        if self.current is None:
            reason = "not cached: cache='off'" if self.settings.mode is CacheMode.OFF else self.why_not or \
                "no image cache in use (not an image pipeline, a mix of sources, or remote workers make the batches)"
            return {"mode": self.settings.mode.value, "use": False, "reason": reason}
        store = self.stores[self.current]
        decision = self.decisions.get(self.current) or pending(self.kinds[self.current], self.settings)
        return {**decision.as_dict(), "kind": self.kinds[self.current], "where": store.where,
                "samples_held": len(store), "bytes_held": int(store.nbytes)}
