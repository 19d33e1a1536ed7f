"""Hostile and unlucky text tables (issue 16): feedline's own index files beside the data, caches that no longer
describe their file, files that change while they are read or converted, and lines too long to hold. Each case
through what a user calls: ``Loader(criteo(...))``, ``open_source`` and ``feedline convert``."""
import glob
import gzip
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import DataError, Loader
from feedline.cli import main as cli
from feedline.loader.sources import index_store, open_source
from feedline.loader.sources.table_rows import RowError
from feedline.pipelines.criteo import criteo

MIB = 1 << 20


pytestmark = pytest.mark.usefixtures("fresh_index_store")


def rows_of(path) -> list[str]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return f.read().splitlines()


def epoch(loader) -> tuple[list[int], list[float]]:
    """One epoch's valid rows: their indices and labels, sorted by index."""
    index, label = [], []
    for batch in loader:
        valid = batch.get("valid", torch.ones(len(batch["index"]), dtype=torch.bool))
        index += batch["index"][valid].tolist()
        label += batch["label"][valid].tolist()
    order = np.argsort(index, kind="stable")
    return [index[k] for k in order], [label[k] for k in order]


def labels(lines) -> list[float]:
    return [float(line.split("\t")[0]) for line in lines]


# ---- 1. feedline's own files never match a user's pattern ----------------------------------------------------

def test_a_glob_over_the_data_never_picks_up_feedlines_index(tmp_path):
    make_criteo(tmp_path / "day_0", 3000, seed=0)
    make_criteo(tmp_path / "day_1", 2000, seed=1)
    pattern = str(tmp_path / "day_*")
    first = Loader(criteo(pattern), batch_size=500, placement="cpu", seed=1)  # writes the indexes
    assert epoch(first)[0] == list(range(5000))
    state = None
    for k, _ in enumerate(first):
        if k == 3:
            state = first.state_dict()
            break
    # Another run (or another rank that expands the pattern after the first wrote its indexes) sees the same
    # files, the same rows, and resumes the first run's state.
    again = Loader(criteo(pattern, on_error="raise"), batch_size=500, placement="cpu", seed=1)
    assert again.source.paths == first.source.paths == [str(tmp_path / "day_0"), str(tmp_path / "day_1")]
    assert len(again.source) == 5000
    again.load_state_dict(state)
    assert sorted(glob.glob(pattern)) == first.source.paths  # the indexes are hidden
    assert all(name.startswith(".") for name in os.listdir(tmp_path) if not name.startswith("day_"))


def test_index_files_of_earlier_versions_beside_the_data_are_left_out(tmp_path):
    make_criteo(tmp_path / "day_0", 1000, seed=0)
    (tmp_path / "day_0.feedline-index.json").write_text('{"version": 1}')       # what feedline 0.1 wrote
    (tmp_path / "day_0.feedline-index.json.4242.tmp").write_text('{"vers')      # and its leftover temp file
    loader = Loader(criteo(str(tmp_path / "day_*")), batch_size=250, placement="cpu")
    assert loader.source.paths == [str(tmp_path / "day_0")]
    assert epoch(loader)[0] == list(range(1000))
    with pytest.raises(DataError, match=r"day_0\.feedline-index\.json: is an index file that feedline wrote"):
        open_source(criteo(str(tmp_path / "day_0.feedline-index.json")).source)


def test_a_planted_link_at_the_old_temporary_name_is_not_followed(tmp_path):
    path = tmp_path / "day.tsv"
    make_criteo(path, 500, seed=0)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    # feedline 0.1 wrote its index through "<file>.feedline-index.json.<pid>.tmp", opened with open(..., "w").
    (tmp_path / f"day.tsv.feedline-index.json.{os.getpid()}.tmp").symlink_to(victim)
    assert len(open_source(criteo(path).source)) == 500
    assert victim.read_text() == "keep me"


def test_a_failed_index_write_leaves_no_file_a_glob_could_match(tmp_path, monkeypatch, caplog):
    path = tmp_path / "day.tsv"
    make_criteo(path, 800, seed=0)
    real_replace = os.replace

    def full_disk(src, dst):
        if "feedline" in os.fspath(dst):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", full_disk)
    with caplog.at_level("WARNING", logger="feedline"):
        loader = Loader(criteo(str(tmp_path / "*")), batch_size=200, placement="cpu")
    assert sorted(os.listdir(tmp_path)) == ["day.tsv"]  # nothing left behind, hidden or not
    assert epoch(loader)[0] == list(range(800))


# ---- 3. a cache is used only while it describes its file ----------------------------------------------------

def same_size_fewer_lines(lines: list[str]) -> list[str]:
    """The lines less the last, with leading zeros added to dense fields so that the bytes add up the same."""
    out = [line.split("\t") for line in lines[:-1]]
    extra = len(lines[-1]) + 1
    k = 0
    while extra:
        fields = out[k % len(out)]
        j = 1 + (k // len(out)) % 13
        if fields[j] and not fields[j].startswith("-"):
            fields[j] = "0" + fields[j]
            extra -= 1
        k += 1
    return ["\t".join(f) for f in out]


@pytest.mark.parametrize("how", ["rsync -t (new inode)", "cp -p (same inode)"])
def test_a_rewrite_with_the_same_size_and_mtime_is_indexed_again(tmp_path, how):
    path = tmp_path / "day.tsv"
    make_criteo(path, 3000, seed=0)
    before = os.stat(path)
    assert len(Loader(criteo(path), batch_size=500, placement="cpu").source) == 3000  # the index is kept
    new_lines = same_size_fewer_lines(rows_of(path))
    text = ("\n".join(new_lines) + "\n").encode()
    assert len(text) == before.st_size
    if how.startswith("rsync"):
        fresh = tmp_path / "fresh"
        fresh.write_bytes(text)
        os.utime(fresh, ns=(before.st_atime_ns, before.st_mtime_ns))
        os.replace(fresh, path)
    else:
        with open(path, "r+b") as f:
            f.write(text)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    for on_error in ("raise", "skip"):
        loader = Loader(criteo(path, on_error=on_error), batch_size=500, placement="cpu", seed=3)
        assert len(loader.source) == 2999
        index, label = epoch(loader)
        assert index == list(range(2999)) and label == labels(new_lines)
        assert loader.skipped == []


def tamper(sidecar_folder, change) -> int:
    """Apply ``change`` to every "starts"/"stops"/"rows" list in the index files feedline left in the folder."""
    changed = 0
    for name in os.listdir(sidecar_folder):
        if "feedline" not in name:
            continue
        doc = json.loads((sidecar_folder / name).read_text())

        def walk(node):
            nonlocal changed
            if isinstance(node, dict):
                for key, value in node.items():
                    if key in ("starts", "stops", "rows") and isinstance(value, list) and value:
                        change(key, value)
                        changed += 1
                    else:
                        walk(value)

        walk(doc)
        (sidecar_folder / name).write_text(json.dumps(doc))
    return changed


@pytest.mark.parametrize("change", [
    lambda key, v: v.__setitem__(0, -5),                            # a negative offset or count
    lambda key, v: v.__setitem__(-1, v[-1] + 7 if key == "rows" else v[-1]),  # a row too many
    lambda key, v: v.append(v[-1]),                                 # lists of different lengths
], ids=["negative", "phantom-row", "ragged"])
def test_an_index_with_impossible_values_is_rebuilt(tmp_path, change):
    path = tmp_path / "day.tsv"
    make_criteo(path, 2500, seed=0)
    open_source(criteo(path).source)
    assert tamper(tmp_path, change)
    loader = Loader(criteo(path, on_error="skip"), batch_size=500, placement="cpu")
    assert len(loader.source) == 2500
    assert epoch(loader) == (list(range(2500)), labels(rows_of(path)))
    assert loader.skipped == []


def test_a_file_changed_after_it_was_opened_raises_naming_it(tmp_path):
    path = tmp_path / "day.tsv"
    make_criteo(path, 6000, seed=0)
    lines = rows_of(path)
    for on_error in ("raise", "skip"):
        loader = Loader(criteo(path, on_error=on_error), batch_size=1000, placement="cpu", shuffle=False)
        path.write_text("\n".join(lines[:2000] + lines[2001:]) + "\n")  # a line gone: every later line moves
        with pytest.raises(DataError, match=f"^{path}: changed since it was indexed"):
            epoch(loader)
        path.write_text("\n".join(lines) + "\n")


# ---- 8. lines too long to hold, and memory that does not grow with the rows ---------------------------------

@pytest.mark.parametrize("name", ["day.tsv", "day.tsv.gz"])
def test_a_line_longer_than_the_limit_is_a_bad_row_naming_its_line(tmp_path, name):
    path = tmp_path / name
    good = rows_of(make_criteo(tmp_path / "good.tsv", 3000, seed=2)["path"])
    huge = "1\t" + "7" * (MIB + 10)  # the limit is 1 MiB a line
    text = "\n".join(good[:1234] + [huge] + good[1234:]) + "\n"
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "wt") as f:
        f.write(text)
    with pytest.raises(DataError, match=f"^{path}:1235: the line is {len(huge) + 1} bytes long, more than"):
        epoch(Loader(criteo(path), batch_size=500, placement="cpu", shuffle=False))
    loader = Loader(criteo(path, on_error="skip"), batch_size=500, placement="cpu", seed=5)
    assert len(loader.source) == 3001
    index, label = epoch(loader)
    assert index == [i for i in range(3001) if i != 1234] and label == labels(good)
    assert [s.where for s in loader.skipped] == [f"{path}:1235"]


PEAK_RSS = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from feedline.loader import Loader
    from feedline.loader.sources import open_source
    from feedline.pipelines.criteo import criteo
    what, path = sys.argv[1], sys.argv[2]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if what == "index":
        source = open_source(criteo(path).source)
        print(len(source), end=" ")
    else:
        loader = Loader(criteo(path, on_error="skip"), batch_size=4096, placement="cpu", num_threads=1)
        print(sum(int(b["valid"].sum()) if "valid" in b else len(b["index"]) for b in loader), end=" ")
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024)
""")


def peak_rss_mb(what: str, path) -> tuple[int, int]:
    """(rows, how many MB the peak RSS grew by) of a fresh process that indexes or reads ``path``."""
    out = subprocess.run([sys.executable, "-c", PEAK_RSS, what, str(path)], capture_output=True, text=True,
                         check=True)
    rows, grew = out.stdout.split()
    return int(rows), int(grew)


def test_indexing_a_file_of_short_lines_keeps_no_line_ends(tmp_path):
    path = tmp_path / "short.tsv"
    with open(path, "wb") as f:
        for _ in range(24):
            f.write(b"1\n" * (1 << 20))  # 24M one-field lines, 48 MiB: an array of their ends would be 192 MiB
    rows, grew = peak_rss_mb("index", path)
    assert rows == 24 << 20
    assert grew < 48


@pytest.mark.parametrize("name", ["long.tsv", "long.tsv.gz"])
def test_one_enormous_line_is_read_in_bounded_memory(tmp_path, name):
    good = rows_of(make_criteo(tmp_path / "good.tsv", 200, seed=1)["path"])
    path = tmp_path / name
    opener = (lambda p, m: gzip.open(p, m, compresslevel=1)) if name.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(("\n".join(good[:100]) + "\n").encode())
        for _ in range(192):
            f.write(b"5" * MIB)  # one line of 192 MiB
        f.write(("\n" + "\n".join(good[100:]) + "\n").encode())
    rows, grew = peak_rss_mb("epoch", path)
    assert rows == 200
    _, grew_without = peak_rss_mb("epoch", tmp_path / "good.tsv")  # the same rows, without the long line
    assert grew < grew_without + 32


# ---- 10. feedline convert never wraps a value ---------------------------------------------------------------

def criteo_lines(count: int, dense_max: int) -> list[str]:
    """Criteo lines whose I1 stays within [0, dense_max] (so the first pass picks a narrow type for it)."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        dense = [str(int(rng.integers(0, dense_max + 1)))] + [str(int(x)) for x in rng.integers(0, 50, 12)]
        ids = [f"{int(x):08x}" for x in rng.integers(0, 2**32, 26)]
        out.append("\t".join([str(i % 2)] + dense + ids))
    return out


@pytest.fixture
def convert_input(tmp_path):
    """60,000 lines (16 chunks, more than a table keeps parsed) whose I1 is below 100 but on line 55,001."""
    lines = criteo_lines(60_000, 99)
    fields = lines[55_000].split("\t")
    fields[1] = "100"
    lines[55_000] = "\t".join(fields)
    path = tmp_path / "day.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path


def rewrite_value(path, old: bytes, new: bytes) -> None:
    """Change a value in place, keeping every line where it was (the mtime restored, as a careless tool might)."""
    stat = os.stat(path)
    data = path.read_bytes()
    at = data.index(old)
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(new)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_convert_fails_naming_the_column_and_line_when_a_value_no_longer_fits(tmp_path, convert_input,
                                                                             monkeypatch):
    from feedline.loader.sources import text_to_columnar as convert_module

    wrote = []

    class RewritingWriter(convert_module.ColumnarWriter):
        def write(self, ints, missing):
            if not wrote:  # the second pass has begun: the input changes under it
                rewrite_value(convert_input, b"\t100\t", b"\t300\t")
            wrote.append(len(ints))
            super().write(ints, missing)

    monkeypatch.setattr(convert_module, "ColumnarWriter", RewritingWriter)
    out = tmp_path / "conv"
    with pytest.raises(RowError, match=f"^{convert_input}:55001: column I1: 300 is outside \\[0, 255\\]"):
        convert_module.convert(criteo(convert_input).source, out)
    assert not out.exists()  # nothing half-written is left to be read as a table


def test_convert_fails_naming_the_file_that_changed_between_its_passes(tmp_path, convert_input, monkeypatch,
                                                                       capsys):
    from feedline.loader.sources import text_to_columnar as convert_module

    real_blocks = convert_module._blocks
    passes = []

    def blocks(table, progress):
        passes.append(1)
        yield from real_blocks(table, progress)
        if len(passes) == 1:  # the input is edited once the first pass has read it
            rewrite_value(convert_input, b"\t100\t", b"\t300\t")

    monkeypatch.setattr(convert_module, "_blocks", blocks)
    out = tmp_path / "conv"
    assert cli(["convert", "criteo", str(convert_input), "--out", str(out), "--no-progress"]) == 2
    assert f"{convert_input}: changed between its two passes of feedline convert" in capsys.readouterr().err
    assert not out.exists()


class _CountingDecompressor:
    """A zlib decompressor that adds the bytes it gives out to a shared count."""

    def __init__(self, inner, count):
        self._inner, self._count = inner, count

    def decompress(self, *args, **kwargs):
        out = self._inner.decompress(*args, **kwargs)
        self._count[0] += len(out)
        return out

    def copy(self):
        return _CountingDecompressor(self._inner.copy(), self._count)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_an_epoch_of_a_gzip_file_decompresses_it_about_once(tmp_path, monkeypatch):
    """Threads read a buffer-full's chunks in different orders; going back must not decompress the file again
    from its top (feedline 0.1 did: twice the file per epoch at 500k rows, four times at 2M)."""
    import zlib

    path = tmp_path / "day.tsv.gz"
    make_criteo(path, 500_000, seed=4)
    lines = rows_of(path)
    text_bytes = sum(len(line) + 1 for line in lines)
    open_source(criteo(path).source)  # the index, built and kept: the epoch below only reads
    count = [0]
    real = zlib.decompressobj
    monkeypatch.setattr(zlib, "decompressobj", lambda *a, **k: _CountingDecompressor(real(*a, **k), count))
    loader = Loader(criteo(path), batch_size=8192, placement="cpu", seed=2, num_threads=2)
    assert epoch(loader) == (list(range(500_000)), labels(lines))  # every row once, each with its own values
    assert count[0] <= 1.5 * text_bytes


def test_a_gzip_stream_resumed_from_a_mark_reads_on_exactly(tmp_path):
    from feedline.loader.sources.gzip_stream import GzipStream

    rng = np.random.default_rng(3)
    text = [rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes(), b"a" * 200_000, b"", b"line\n" * 9_000]
    path = tmp_path / "members.gz"
    path.write_bytes(b"".join(gzip.compress(t) for t in text) + bytes(100))  # four members, zero padding
    whole = b"".join(text)
    marks = []
    with GzipStream(str(path)) as stream:
        got = []
        while block := stream.read(int(rng.integers(1, 70_000))):
            got.append(block)
            if rng.random() < 0.3:
                marks.append(stream.mark())
    assert b"".join(got) == whole and len(marks) > 5
    for mark in marks:
        with GzipStream.resume(str(path), mark) as again:
            rest = []
            while block := again.read(50_000):
                rest.append(block)
        assert b"".join(rest) == whole[mark.position:]


def test_concatenated_gzip_files_read_as_one(tmp_path):
    """``cat a.gz b.gz``: a first member that ends in the middle of a read, after output larger than a read."""
    second = make_criteo(tmp_path / "second.tsv.gz", 9000, seed=1)["path"]
    one_line = rows_of(second)[0]
    path = tmp_path / "both.tsv.gz"
    path.write_bytes(gzip.compress(((one_line + "\n") * 20_000).encode()) + open(second, "rb").read())
    lines = [one_line] * 20_000 + rows_of(second)
    loader = Loader(criteo(path), batch_size=1000, placement="cpu", seed=1, shuffle_buffer=4000)
    assert len(loader.source) == 29_000
    assert epoch(loader) == (list(range(29_000)), labels(lines))


def test_gzip_files_read_in_turn_hold_the_marks_of_two_at_most(tmp_path):
    paths = [make_criteo(tmp_path / f"day_{k}.tsv.gz", 12_000, seed=k)["path"] for k in range(4)]
    lines = [line for p in paths for line in rows_of(p)]
    loader = Loader(criteo(str(tmp_path / "day_*.tsv.gz")), batch_size=1000, placement="cpu", seed=3,
                    shuffle_buffer=5000, num_threads=2)
    for _ in range(2):  # the second epoch reads files whose cursors let go of everything
        assert epoch(loader) == (list(range(48_000)), labels(lines))
        cursors = list(loader.source.reader._cursors.values())
        assert len(cursors) == 4
        assert sum(bool(c.marks or c.kept or c.stream) for c in cursors) <= 2
