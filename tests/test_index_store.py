"""The sidecar store for indexes: hidden names that globs miss, content fingerprints, safe writes."""
import glob
import os
import shutil

import pytest

from feedline.loader.sources import index_store
from feedline.loader.sources.index_store import Fingerprint
from feedline.pipelines.own_files import is_own_file, sidecar_name


pytestmark = pytest.mark.usefixtures("fresh_index_store")


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_a_sidecar_is_never_matched_by_the_users_glob(tmp_path):
    data = _write(tmp_path / "day_0", b"1\t2\n")
    where = index_store.save(data, "lines", 1, Fingerprint.of(data), {"rows": [1]})
    assert where == str(tmp_path / sidecar_name("day_0", "lines"))
    assert glob.glob(str(tmp_path / "day_*")) == [str(data)]
    assert glob.glob(str(tmp_path / "*")) == [str(data)]
    assert is_own_file(where) and not is_own_file(data)


@pytest.mark.parametrize("name", ["day_0.feedline-index.json", ".s0.tar.feedline-idx",
                                  "day_0.feedline-index.json.4242.tmp", ".s0.tar.feedline-idx.12.140.tmp",
                                  ".day_0.feedline-lines.99.a1b2c3d4.tmp"])
def test_files_of_earlier_versions_and_temporaries_are_recognised(name):
    assert is_own_file(f"/data/{name}")


@pytest.mark.parametrize("name", ["day_0", "day_0.tsv", "train-000.tar", "feedline-notes.txt", "a.json"])
def test_user_files_are_not_taken_for_feedlines(name):
    assert not is_own_file(f"/data/{name}")


def test_load_returns_what_was_saved_for_the_same_content(tmp_path):
    data = _write(tmp_path / "f.tsv", b"a" * 100_000)
    index_store.save(data, "lines", 3, Fingerprint.of(data), {"rows": [1, 2, 3]})
    assert index_store.load(data, "lines", 3, Fingerprint.of(data)) == {"rows": [1, 2, 3]}
    assert index_store.load(data, "lines", 4, Fingerprint.of(data)) is None  # another version of the index
    assert index_store.load(data, "other", 3, Fingerprint.of(data)) is None


def test_a_rewrite_with_the_same_size_and_mtime_is_not_trusted(tmp_path):
    data = _write(tmp_path / "f.tsv", b"1\t2\n" * 1000)
    before = os.stat(data)
    index_store.save(data, "lines", 1, Fingerprint.of(data), {"rows": [1000]})
    copy = tmp_path / "new.tsv"
    copy.write_bytes(b"3\t4\n" * 1000)
    os.utime(copy, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(copy, data)  # as rsync -t does: same size and mtime, new inode and content
    after = os.stat(data)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert index_store.load(data, "lines", 1, Fingerprint.of(data)) is None


def test_a_rewrite_in_place_of_a_middle_block_is_not_trusted(tmp_path):
    data = _write(tmp_path / "f.bin", bytes(400_000))
    mtime = os.stat(data).st_mtime_ns
    index_store.save(data, "lines", 1, Fingerprint.of(data), {"x": 1})
    with open(data, "r+b") as f:  # the middle: outside the head and tail blocks
        f.seek(200_000)
        f.write(b"changed")
    os.utime(data, ns=(mtime, mtime))
    assert index_store.load(data, "lines", 1, Fingerprint.of(data)) is None  # the change time moved


def test_a_planted_link_at_a_temporary_name_is_not_followed(tmp_path, monkeypatch):
    data = _write(tmp_path / "f.tsv", b"1\n")
    victim = _write(tmp_path / "victim", b"keep me")
    monkeypatch.setattr(index_store.secrets, "token_hex", lambda n: "deadbeef")
    planted = tmp_path / f"{sidecar_name('f.tsv', 'lines')}.{os.getpid()}.deadbeef.tmp"
    planted.symlink_to(victim)
    where = index_store.save(data, "lines", 1, Fingerprint.of(data), {"rows": [1]})
    assert victim.read_bytes() == b"keep me"
    assert where == "memory"  # the exclusive create refused the planted name; nothing written through it
    assert index_store.load(data, "lines", 1, Fingerprint.of(data)) == {"rows": [1]}


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    data = _write(tmp_path / "f.tsv", b"1\n")

    def no_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(index_store.os, "replace", no_replace)
    assert index_store.save(data, "lines", 1, Fingerprint.of(data), {"rows": [1]}) == "memory"
    assert sorted(os.listdir(tmp_path)) == ["f.tsv"]


def test_an_unwritable_folder_keeps_the_index_in_memory_and_says_so_once(tmp_path, monkeypatch, caplog):
    folder = tmp_path / "ro"
    folder.mkdir()
    a, b = _write(folder / "a.tsv", b"1\n"), _write(folder / "b.tsv", b"2\n")

    def read_only(target, text):  # what a read-only mount answers (chmod does not stop root, who runs CI)
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(index_store, "_write", read_only)
    with caplog.at_level("WARNING", logger="feedline"):
        assert index_store.save(a, "lines", 1, Fingerprint.of(a), {"rows": [1]}) == "memory"
        assert index_store.save(b, "lines", 1, Fingerprint.of(b), {"rows": [2]}) == "memory"
    assert index_store.load(b, "lines", 1, Fingerprint.of(b)) == {"rows": [2]}
    assert sum("cannot keep" in r.message for r in caplog.records) == 1
    assert sorted(os.listdir(folder)) == ["a.tsv", "b.tsv"]


def test_an_unwritable_folder_uses_the_index_dir_when_set(tmp_path, monkeypatch):
    data = _write(tmp_path / "f.tsv", b"1\n")
    elsewhere = tmp_path / "indexes"
    monkeypatch.setenv(index_store.INDEX_DIR_ENV, str(elsewhere))
    real_write = index_store._write

    def refuse_beside(target, text):
        if os.path.dirname(target) == str(tmp_path):
            raise PermissionError(13, "Permission denied")
        real_write(target, text)

    monkeypatch.setattr(index_store, "_write", refuse_beside)
    where = index_store.save(data, "lines", 1, Fingerprint.of(data), {"rows": [1]})
    assert os.path.dirname(where) == str(elsewhere)
    index_store.forget_memory()
    assert index_store.load(data, "lines", 1, Fingerprint.of(data)) == {"rows": [1]}


def test_a_sidecar_that_is_not_ours_is_ignored(tmp_path):
    data = _write(tmp_path / "f.tsv", b"1\n")
    (tmp_path / sidecar_name("f.tsv", "lines")).write_text('{"format": "something-else"}')
    assert index_store.load(data, "lines", 1, Fingerprint.of(data)) is None
    (tmp_path / sidecar_name("f.tsv", "lines")).write_bytes(b"\xff\x00not json")
    assert index_store.load(data, "lines", 1, Fingerprint.of(data)) is None


def test_a_copied_tree_keeps_its_indexes_only_where_the_content_matches(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    data = _write(src / "f.tsv", b"1\t2\n" * 10)
    index_store.save(data, "lines", 1, Fingerprint.of(data), {"rows": [10]})
    dst = tmp_path / "dst"
    shutil.copytree(src, dst)  # a new inode: the copy's index is rebuilt, never trusted blindly
    assert index_store.load(dst / "f.tsv", "lines", 1, Fingerprint.of(dst / "f.tsv")) is None
