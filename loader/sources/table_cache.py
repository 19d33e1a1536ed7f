"""Text tables converted as they are parsed: the first epoch writes each chunk it parses in the converted form
(``cached_chunks``), so later epochs, later Loaders and other ranks read it with one ``preadv`` instead of
parsing it again, with no ``feedline convert`` by hand.

Where: beside each file in a hidden folder (``.<file>.feedline-tablecache``, which no glob over the data
matches); where the folder cannot be written, in ``FEEDLINE_INDEX_DIR``; with ``CacheSettings.directory``,
there. Inside, one folder per key: the file's content fingerprint (``index_store.Fingerprint``), the parse's
definition (columns, syntax, header layout, the line index's chunk size) and a digest of the parser's own
source, so a changed file or definition (or parser) never reads an older conversion; folders of an older
fingerprint of the file are removed. Each chunk file carries a key of its own, the folder's with the chunk's
bounds (bytes, first line, rows), so a chunk is read back only into the very chunk it was made from, and the
key is known before the file's index is complete (a gzip file indexed while it is read, ``index_lazily``). A
chunk read from the cache is used only while the file still has the fingerprint's size, times and inode (one
``stat``); otherwise it is parsed, which meets the change as parsing does.

Whether: ``cache_policy.decide`` on measured figures. Until it has them every parsed chunk is written (and, for
the first ones, read back, timed); ``recompute_s`` is what parsing a chunk took (its read included), ``read_s``
what reading its converted form took, ``bytes_needed`` the converted size of every row against the cache
folder's free space. A cache that does not pay is removed again. With ``AUTO``, a table no larger than the
rows the Loader keeps parsed in memory is not cached (its later epochs parse nothing anyway).
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import statistics
import struct
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from ...pipelines.own_files import sidecar_name
from ...pipelines.tabular import ColumnKind, TabularFiles
from ..cache_policy import CacheDecision, CacheMode, CacheSettings, decide, pending
from . import cached_chunks
from .cached_chunks import ParsedChunk
from .chunk_cache import PackedChunk
from .chunked import ChunkIndex
from .index_store import INDEX_DIR_ENV, Fingerprint
from . import line_index
from .table_rows import RowError
from .text import TextFormat

log = logging.getLogger("feedline")
KIND = "tablecache"
KEY_FILE = "key.feedline-tablekey"
VERSION = 1
PROBE_CHUNKS = 3  # chunks parsed and read back before deciding (fewer where the table has fewer)
_PARSER_SOURCES = ("text_parse.py", "text_syntax.py", "tsv.py", "text.py", "line_index.py", "cached_chunks.py")
_packed = functools.partial(tuple.__new__, PackedChunk)  # a PackedChunk of a tuple of its fields, made in C


def text_format(files: TabularFiles, settings: CacheSettings | None, memory_rows: int) -> TextFormat:
    """The format of a text table: parsed every epoch, or (a ``settings`` that is not OFF) cached as parsed.
    ``memory_rows``: the parsed rows the table keeps in memory."""
    if settings is None or settings.mode is CacheMode.OFF or sys.byteorder != "little":  # (chunk files are LE)
        return TextFormat(files)
    return CachedTextFormat(files, settings, memory_rows)


class CachedTextFormat(TextFormat):
    """``TextFormat`` whose chunks come from the cache where it holds them, else parsed (and kept)."""

    def __init__(self, files: TabularFiles, settings: CacheSettings, memory_rows: int):
        super().__init__(files)
        scalars = sum(c.kind is not ColumnKind.INT_LIST for c in self.columns)
        lists = tuple(c.name for c in self.columns if c.kind is ColumnKind.INT_LIST)
        self.cache = TableCache(settings, memory_rows, scalars, lists)
        self._indexes: dict[str, ChunkIndex] = {}
        self._row_bytes: float | None = None
        # The chunk ``cached_row_bytes`` parsed (path, chunk, bounds, parsed, seconds), for its first load to use.
        self._parsed_first: tuple | None = None
        self._parsed_first_lock = threading.Lock()
        threading.Thread(target=_warm_up, name="feedline-table-cache-warm-up", daemon=True).start()

    def index(self, path: str) -> ChunkIndex:
        before = Fingerprint.of(path)
        index = super().index(path)
        same = Fingerprint.of(path) == before  # content that moved while it was indexed is never cached
        self.cache.add(path, index, before if same else None, self._definition())
        self._indexes[path] = index
        return index

    def index_lazily(self, path: str, on_publish, on_complete=None):
        """``TsvFormat.index_lazily``, the file's chunks cached as they are parsed from the start: its key needs
        no chunk list, and until the index is complete its rows are the scan's estimate."""
        before = Fingerprint.of(path)
        growing = None

        def published(index: ChunkIndex, complete: bool) -> None:
            self._indexes[path] = index
            if not complete:  # (complete: added again below, with the content checked)
                estimate = index.rows.sum() if growing is None else max(growing.estimate_rows(), index.rows.sum())
                self.cache.add(path, index, before, self._definition(), rows=int(estimate))
            on_publish(index, complete)

        def completed(index: ChunkIndex) -> None:
            same = Fingerprint.of(path) == before
            self.cache.add(path, index, before if same else None, self._definition())
            if on_complete is not None:
                on_complete(index)

        self.cache.add(path, ChunkIndex.empty(), before, self._definition(), rows=0)
        growing = super().index_lazily(path, published, completed)
        if growing is None:
            self.cache.forget(path)
        return growing

    def cached_row_bytes(self, path: str) -> float | None:
        """Bytes a row of a kept chunk takes where the cache is to be read (``ChunkedTable`` plans its gathers by
        it: narrow records are gathered as they are, not first prepared, as a converted table's), from a kept
        chunk's header or else the first chunk parsed (then handed to its first load, not parsed again); None (a
        parsed block's) where it is not to be read."""
        if self._row_bytes is None:
            self._row_bytes = 0.0
            first = next(iter(self._indexes), None)
            if first is not None and self.cache.expected() and self._indexes[first].rows.size:
                index = self._indexes[first]
                layout = self.cache.stored_layout(first, index, 0)
                if layout is None:
                    started = time.perf_counter()
                    try:
                        parsed = self.load(first, index, 0)
                    except (RowError, OSError):  # (met again, and said, when the chunk is read)
                        parsed = None
                    if parsed is not None:
                        self._parsed_first = (first, 0, _bounds(index, 0), parsed, time.perf_counter() - started)
                    if parsed is not None and parsed.ints is not None:
                        floats = 0 if parsed.floats is None else parsed.floats.shape[1]
                        layout = cached_chunks.layout_of(np.ascontiguousarray(parsed.ints, np.int64), floats)
                if layout is not None:
                    self._row_bytes = float(layout.record + layout.flag_bytes)
        return self._row_bytes or None

    def _definition(self) -> dict:
        layout = self.layout
        return {"columns": [repr(c) for c in self.columns], "syntax": repr(layout.syntax),
                "fields": [None if c is None else c.name for c in layout.fields], "names": list(layout.names),
                "header": self.header}

    def load_packed(self, path: str, index: ChunkIndex, chunk: int, pack) -> PackedChunk:
        """Chunk ``chunk`` as ``ChunkedTable`` keeps it: read from the cache, or parsed and packed by ``pack``."""
        def parse() -> tuple[PackedChunk, ParsedChunk, float]:
            started = time.perf_counter()
            parsed, before = self._parsed_first_taken(path, index, chunk) if self._parsed_first else (None, 0.0)
            if parsed is None:
                parsed = self.load(path, index, chunk)
            packed = pack(parsed)
            rows = packed.bad.size
            ints = np.zeros((rows, 0), np.int64) if parsed.ints is None else parsed.ints
            floats = np.zeros((rows, 0), np.float64) if parsed.floats is None else parsed.floats
            return packed, ParsedChunk(np.ascontiguousarray(ints, dtype=np.int64), floats,
                                       np.asarray(parsed.missing, dtype=bool), packed.lists, packed.bad,
                                       packed.reasons), before + time.perf_counter() - started
        return self.cache.load(path, index, chunk, parse)

    def _parsed_first_taken(self, path: str, index: ChunkIndex, chunk: int):
        """(The parse of chunk ``chunk`` that ``cached_row_bytes`` made, where this is that chunk, and the seconds
        it took; else (None, 0.0).) Taken once."""
        with self._parsed_first_lock:
            held = self._parsed_first
            if held is None or held[:3] != (path, chunk, _bounds(index, chunk)):
                return None, 0.0
            self._parsed_first = None
        return held[3], held[4]

    @property
    def cache_decision(self) -> CacheDecision:
        """Whether the table's converted chunks are used, and why."""
        return self.cache.decision


def _warm_up() -> None:
    """(While the files are indexed.) The parser's kernel (``TextFormat`` loads it on a thread of its own; this
    waits for it, so as not to slow it) then the encoding's."""
    from .text_parse import warm_up

    warm_up()
    cached_chunks.warm_up()


def _bounds(index: ChunkIndex, chunk: int) -> tuple[int, int, int, int]:
    """A chunk's bytes, first line and rows."""
    return (int(index.starts[chunk]), int(index.stops[chunk]), int(index.lines[chunk]), int(index.rows[chunk]))


class _File:
    """One file of the table: its cache key, what identifies its content, and where its chunks are kept."""

    def __init__(self, path: str, key: bytes | None, fingerprint: Fingerprint | None, candidates: list[str],
                 definition: dict):
        self.path, self.key, self.fingerprint, self.definition = path, key, fingerprint, definition
        self.rows = self.chunks = 0  # what the table's counts hold of this file
        self.candidates = candidates  # key folders, in the order they are tried for writing
        self.readable = [c for c in candidates if os.path.isdir(c)]
        self.folder: str | None = None  # where this process writes ("" when nowhere can be)
        self.identity = None if fingerprint is None else (fingerprint.size, fingerprint.mtime_ns,
                                                          fingerprint.ctime_ns, fingerprint.inode, fingerprint.device)
        self.by_number: dict[int, _Chunk] = {}  # ``chunk``'s, for the index ``numbered`` (the latest asked with)
        self.numbered = None

    def chunk(self, index: ChunkIndex, chunk: int) -> _Chunk:
        """Chunk ``chunk`` of the file indexed as ``index``: its key and rows worked out once (again for an index
        that grew: a lazily indexed file's)."""
        if index is not self.numbered:
            self.by_number, self.numbered = {}, index
        got = self.by_number.get(chunk)
        if got is None:
            bounds = _bounds(index, chunk)
            got = self.by_number[chunk] = _Chunk(None if self.key is None else _chunk_key(self.key, bounds), bounds[3])
        return got

    def unchanged(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev) == self.identity

    def writable_folder(self) -> tuple[str, str]:
        """The key folder this process writes into, made (with its key file) where first possible; ("", why)
        where none can be."""
        if self.folder is not None:
            return self.folder, ""
        errors = []
        for candidate in self.candidates:
            try:
                os.makedirs(candidate, exist_ok=True)
                cached_chunks.remove_stale_temporaries(candidate)
                doc = {"format": "feedline-tablecache", "version": VERSION, "file": os.path.realpath(self.path),
                       "fingerprint": _content(self.fingerprint), "definition": self.definition}
                cached_chunks.write_file(os.path.join(candidate, KEY_FILE), [json.dumps(doc).encode()])
                self.folder = candidate
                if candidate not in self.readable:
                    self.readable.insert(0, candidate)
                return candidate, ""
            except OSError as e:
                errors.append(f"{candidate}: {e.strerror or e}")
        self.folder = ""
        where = "; ".join(errors) if errors else "no folder"
        return "", (f"no folder for the cache of {self.path} can be written ({where}); set {INDEX_DIR_ENV} or "
                    f"CacheSettings.directory to a writable folder")


class _Chunk:
    """A chunk of a cached file: its chunk file's key (None: not cached), rows, and what its chunk file was when
    last read or written, and where (``cached_chunks.Known``; ``folder``: None until then)."""

    __slots__ = ("key", "rows", "folder", "known")

    def __init__(self, key: bytes | None, rows: int):
        self.key, self.rows, self.folder, self.known = key, rows, None, cached_chunks.Known()


class TableCache:
    """The files of one table, the figures measured on them and the decision taken from those."""

    def __init__(self, settings: CacheSettings, memory_rows: int, scalars: int, lists: tuple[str, ...]):
        self.settings, self.memory_rows = settings, memory_rows
        self._shape = (scalars, lists)  # a chunk's scalar columns and list columns
        self._writing = True
        self.files: dict[str, _File] = {}
        self.rows = self.chunks = 0
        self._lock = threading.Lock()
        self._state = "measuring"  # then "using" or "off"
        self._parse: list[float] = []  # seconds a row, by chunk
        self._read: list[float] = []
        self._row_bytes: list[float] = []
        self._written: list[str] = []  # chunk files this process wrote (removed if the cache does not pay)
        self._first = True
        self.decision = pending("table", settings)

    def add(self, path: str, index: ChunkIndex, fingerprint: Fingerprint | None, definition: dict, *,
            rows: int | None = None) -> None:
        """The file ``path`` indexed as ``index``; ``rows``: its rows where the index is not yet complete (an
        estimate). A file added again (its index grown) keeps its key and folders while its content is the same;
        its rows and chunks are counted once."""
        rows = int(index.rows.sum()) if rows is None else int(rows)
        old = self.files.get(path)
        if old is not None:
            self.rows -= old.rows
            self.chunks -= old.chunks
        if old is None or old.fingerprint != fingerprint or old.definition != definition:
            key = None
            if fingerprint is not None:
                doc = {"version": VERSION, "fingerprint": _content(fingerprint), "definition": definition,
                       "parser": _parser_digest(), "chunking": [line_index.CHUNK_BYTES, line_index.MAX_LINE_BYTES]}
                key = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).digest()[:cached_chunks.KEY_BYTES]
            folders = _cache_folders(path, self.settings)
            if fingerprint is not None and old is None:
                for folder in folders:
                    _remove_other_versions(folder, fingerprint)
            old = self.files[path] = _File(path, key, fingerprint,
                                           [os.path.join(f, key.hex()) for f in folders] if key else [], definition)
        old.rows, old.chunks = rows, int(index.rows.size)
        self.rows += old.rows
        self.chunks += old.chunks
        with self._lock:
            if self._state == "measuring":  # (a decision taken stays: a lazily indexed file is added as it grows)
                self.decision = pending(_what(self.files), self.settings)

    def forget(self, path: str) -> None:
        """``path`` is not this table's after all (added for a lazy index that was not needed)."""
        old = self.files.pop(path, None)
        if old is not None:
            self.rows -= old.rows
            self.chunks -= old.chunks

    def expected(self) -> bool:
        """Whether the cache is to be read (before measuring: not OFF, and with AUTO a table larger than the
        rows the Loader keeps parsed)."""
        return self.settings.mode is CacheMode.ON or (self.settings.mode is CacheMode.AUTO
                                                      and self.rows > self.memory_rows)

    def stored_layout(self, path: str, index: ChunkIndex, chunk: int):
        f = self.files[path]
        key = f.chunk(index, chunk).key
        for folder in f.readable if key is not None else ():
            layout = cached_chunks.stored_layout(folder, chunk, key, self._shape[0])
            if layout is not None:
                return layout
        return None

    def load(self, path: str, index: ChunkIndex, chunk: int, parse) -> PackedChunk:
        """Chunk ``chunk`` of ``path`` (indexed as ``index``) from the cache, else ``parse()``d (and kept while the
        cache is wanted): ``parse()`` gives the chunk packed, as parsed, and the seconds parsing it took."""
        f = self.files[path]
        c = f.by_number.get(chunk) if index is f.numbered else None  # (f.chunk's lookup, inline: every load)
        if c is None:
            c = f.chunk(index, chunk)
        if self._first:
            self._start()
        if self._state == "off" or c.key is None or not c.rows or not f.unchanged():
            return parse()[0]
        if self._state == "using" and c.folder is not None:  # (decided, and known: what every later epoch reads)
            stored = cached_chunks.read(c.folder, chunk, c.key, c.rows, *self._shape, c.known)
            if stored is not None:  # (made in C: no named tuple's Python constructor, ~2 loads a batch)
                return _packed((stored.block, stored.lists, stored.bad, stored.reasons, bool(stored.reasons)))
        return self._read_or_parse(f, c, chunk, parse)

    def _read_or_parse(self, f: _File, c: _Chunk, chunk: int, parse) -> PackedChunk:
        started = time.perf_counter()
        for folder in f.readable:
            stored = cached_chunks.read(folder, chunk, c.key, c.rows, *self._shape, c.known)
            if stored is not None:
                c.folder = folder
                self._note(read=(time.perf_counter() - started) / c.rows, parse=stored.parse_s_per_row,
                           row_bytes=stored.nbytes / c.rows)
                return PackedChunk(stored.block, stored.lists, stored.bad, stored.reasons, bool(stored.reasons))
        packed, parsed, seconds = parse()
        parse_s = seconds / c.rows
        self._note(parse=parse_s)
        if self._state == "off" or not self._writing:
            return packed
        made = cached_chunks.encoded(parsed, c.key, parse_s)
        self._keep(f, c, chunk, made, parse_s)
        # Gathered from the records kept, as when read back: narrower than the parsed block, and what the table's
        # plan (``cached_row_bytes``) was made for.
        return packed._replace(block=made.block)

    # ---- the decision --------------------------------------------------------------------------------
    def _start(self) -> None:
        """At the first chunk read (every file indexed by then): with AUTO, a table the Loader keeps parsed in
        memory whole is not cached."""
        with self._lock:
            if not self._first:
                return
            self._first = False
            if self.settings.mode is CacheMode.AUTO and not self.expected():
                self._state = "off"
                self.decision = CacheDecision(
                    False, f"not cached: the table's {self.rows:,} rows fit in the {self.memory_rows:,} parsed rows "
                           f"the Loader keeps in memory, so epochs after the first parse nothing",
                    _what(self.files), self.settings.mode.value, measured=False)
                log.info("feedline: %s: %s", self.decision.what, self.decision.reason)

    def _keep(self, f: _File, c: _Chunk, chunk: int, made: cached_chunks.Encoded, parse_s: float) -> None:
        """A parsed chunk's file (``cached_chunks.encoded``) written to the cache (and, while deciding, read back
        and timed)."""
        folder, why = f.writable_folder()
        if not folder:
            if not any(other.folder != "" for other in self.files.values()):
                self._stop(why)
            return
        key, rows = c.key, c.rows
        try:
            size = cached_chunks.write(folder, chunk, made.pieces)
            cached_chunks.note_written(c.known, folder, chunk, key, size, made, parse_s)
            c.folder = folder
        except OSError as e:
            self._stop(f"writing the cache of {f.path} in {folder} failed: {e.strerror or e}")
            return
        target = os.path.join(folder, cached_chunks.chunk_name(chunk))
        with self._lock:
            self._written.append(target)
            removed = self._state == "off"
            measuring = self._state == "measuring" and len(self._read) < PROBE_CHUNKS
        if removed:  # decided against while this chunk was written
            _unlink(target)
            return
        if measuring:
            started = time.perf_counter()
            stored = cached_chunks.read(folder, chunk, key, rows, *self._shape, c.known)
            if stored is not None:
                self._note(read=(time.perf_counter() - started) / rows, row_bytes=size / rows)

    def _note(self, *, read: float | None = None, parse: float | None = None, row_bytes: float | None = None):
        with self._lock:
            for samples, value in ((self._read, read), (self._parse, parse), (self._row_bytes, row_bytes)):
                if value is not None and len(samples) < 64:
                    samples.append(value)
            if self._state != "measuring":
                return
            need = min(PROBE_CHUNKS, self.chunks)
            if len(self._parse) < need or len(self._read) < need or not self._row_bytes:
                return
            self._decide()

    def _decide(self) -> None:
        per_chunk = self.rows / max(self.chunks, 1)
        folder = next((f.folder for f in self.files.values() if f.folder), None) or \
            next((f.readable[0] for f in self.files.values() if f.readable), None)
        root = os.path.dirname(folder) if folder else os.path.dirname(os.path.abspath(next(iter(self.files))))
        held = sum(_folder_bytes(f.folder) for f in self.files.values() if f.folder)
        space = shutil.disk_usage(folder or root).free + held
        self.decision = decide(what=_what(self.files), recompute_s=statistics.median(self._parse) * per_chunk,
                               read_s=statistics.median(self._read) * per_chunk,
                               bytes_needed=int(statistics.median(self._row_bytes) * self.rows),
                               settings=replace(self.settings, directory=root), space_bytes=space)
        self._state = "using" if self.decision.use else "off"
        log.info("feedline: %s: %s", self.decision.what, self.decision.reason)
        if not self.decision.use:
            self._remove_written()

    def _stop(self, why: str) -> None:
        """Nothing more is written (``why``); a cache already decided on is still read."""
        with self._lock:
            if not self._writing:
                return
            self._writing = False
            if self._state == "measuring":
                self._state = "off"
                self.decision = CacheDecision(False, f"not cached: {why}", _what(self.files),
                                              self.settings.mode.value, measured=False)
                self._remove_written()
        log.warning("feedline: %s", why)

    def _remove_written(self) -> None:
        for target in self._written:
            _unlink(target)
        self._written.clear()
        for f in self.files.values():  # folders left empty (but for their key file) go too
            for folder in f.candidates:
                if _only_key_file(folder):
                    _unlink(os.path.join(folder, KEY_FILE))
                for empty in (folder, os.path.dirname(folder)):
                    try:
                        os.rmdir(empty)
                    except OSError:
                        pass


def _chunk_key(key: bytes, bounds: tuple[int, int, int, int]) -> bytes:
    """A chunk file's key: its folder's with the chunk's bounds."""
    return hashlib.sha256(key + struct.pack("<4q", *bounds)).digest()[:cached_chunks.KEY_BYTES]


def _what(files: dict) -> str:
    names = [os.path.basename(p) for p in files]
    more = f" and {len(names) - 1} more file(s)" if len(names) > 1 else ""
    return f"table {names[0] if names else '?'}{more}: parsed chunks kept converted"


def _cache_folders(path: str, settings: CacheSettings) -> list[str]:
    """Where a file's cache may go, in order of preference."""
    name = os.path.basename(path)
    key = hashlib.sha256(os.path.realpath(path).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    elsewhere = sidecar_name(f"{key}-{name}", KIND)
    if settings.directory is not None:
        return [os.path.join(settings.directory, elsewhere)]
    folders = [os.path.join(os.path.dirname(os.path.abspath(path)), sidecar_name(name, KIND))]
    if os.environ.get(INDEX_DIR_ENV):
        folders.append(os.path.join(os.environ[INDEX_DIR_ENV], elsewhere))
    return folders


def _remove_other_versions(folder: str, fingerprint: Fingerprint) -> None:
    """Key folders of ``folder`` made from another version of the file's content: never read again."""
    try:
        entries = [e for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for entry in entries:
        try:
            doc = json.loads(Path(entry.path, KEY_FILE).read_text())
            if doc.get("fingerprint") != _content(fingerprint):
                shutil.rmtree(entry.path, ignore_errors=True)
        except (OSError, ValueError, AttributeError):
            pass


def _content(fingerprint: Fingerprint) -> dict:
    """What identifies the file's content, wherever it is mounted: its fingerprint less the device number (which
    differs between the machines that mount one network file system, whose ranks share one cache)."""
    fields = asdict(fingerprint)
    del fields["device"]
    return fields


def _only_key_file(folder: str) -> bool:
    try:
        return [e.name for e in os.scandir(folder)] == [KEY_FILE]
    except OSError:
        return False


def _folder_bytes(folder: str) -> int:
    try:
        return sum(e.stat(follow_symlinks=False).st_size for e in os.scandir(folder) if e.is_file())
    except OSError:
        return 0


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


_digest: str | None = None


def _parser_digest() -> str:
    """A digest of the parser's source: a cache made by another parser is never read."""
    global _digest
    if _digest is None:
        h = hashlib.sha256()
        here = Path(__file__).parent
        for name in _PARSER_SOURCES:
            try:
                h.update((here / name).read_bytes())
            except OSError:
                from importlib.metadata import version
                h.update(version("feedline").encode())
        _digest = h.hexdigest()
    return _digest
