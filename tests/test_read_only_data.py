"""Data in a folder that cannot be written (a read-only mount, issue 16): the Loader delivers every sample, writes
nothing there, says once where its indexes went, and keeps them in ``FEEDLINE_INDEX_DIR`` when that names a
writable folder. Through what a user calls: ``Loader(criteo(...))`` and ``Loader(image.val(shards))``.

CI runs as root, whom ``chmod`` does not stop, so the folder is made read-only the way a read-only mount
answers: every call that would create, write, rename into or make a folder inside it fails with ``EROFS``."""
from __future__ import annotations

import errno
import os

import numpy as np
import pytest
import torch

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import Loader
from feedline.loader.sources import index_store
from feedline.pipelines import image
from feedline.pipelines.criteo import criteo

import hostile_tars as ht

WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


pytestmark = pytest.mark.usefixtures("fresh_index_store")


def read_only(monkeypatch, folder) -> list[str]:
    """Make ``folder`` answer as a read-only mount; returns the list of refused paths."""
    folder = os.path.realpath(folder)
    refused = []

    def inside(path) -> bool:
        try:
            path = os.path.realpath(os.fspath(path))
        except TypeError:  # a file descriptor
            return False
        return path == folder or path.startswith(folder + os.sep)

    def refuse(path):
        refused.append(os.fspath(path))
        raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))

    real_open, real_mkdir, real_replace, real_rename = os.open, os.mkdir, os.replace, os.rename

    def open_(path, flags, *args, **kwargs):
        if flags & WRITES and inside(path):
            refuse(path)
        return real_open(path, flags, *args, **kwargs)

    def mkdir(path, *args, **kwargs):
        if inside(path):
            refuse(path)
        return real_mkdir(path, *args, **kwargs)

    def move(real):
        def moved(src, dst, *args, **kwargs):
            if inside(dst):
                refuse(dst)
            return real(src, dst, *args, **kwargs)
        return moved

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "replace", move(real_replace))
    monkeypatch.setattr(os, "rename", move(real_rename))
    return refused


def rows_and_labels(loader) -> tuple[list[int], list[float]]:
    index, label = [], []
    for batch in loader:
        valid = batch["valid"]
        index += batch["index"][valid].tolist()
        label += batch["label"][valid].tolist()
    order = np.argsort(index, kind="stable")
    return [index[k] for k in order], [label[k] for k in order]


def file_labels(paths) -> list[float]:
    return [float(line.split("\t", 1)[0]) for p in paths for line in open(p).read().splitlines()]


def test_a_table_in_a_read_only_folder_is_read_whole_and_nothing_is_written_there(tmp_path, monkeypatch, caplog):
    data = tmp_path / "data"
    data.mkdir()
    paths = [make_criteo(data / f"day_{k}", rows, seed=k)["path"] for k, rows in enumerate((3000, 2000))]
    before = sorted(os.listdir(data))
    refused = read_only(monkeypatch, data)
    with caplog.at_level("WARNING", logger="feedline"):
        for _ in range(2):  # a second Loader in the same process: the indexes kept in memory serve it
            loader = Loader(criteo(str(data / "day_*")), batch_size=500, placement="cpu", seed=1)
            assert rows_and_labels(loader) == (list(range(5000)), file_labels(paths))
            loader.close()
    assert refused  # the folder was asked to take an index, and refused it
    assert sorted(os.listdir(data)) == before
    said = [r.getMessage() for r in caplog.records if "cannot keep" in r.getMessage()]
    assert len(said) == 1 and str(data) in said[0] and index_store.INDEX_DIR_ENV in said[0]


def test_a_read_only_folders_indexes_go_to_the_index_dir(tmp_path, monkeypatch, caplog):
    data, elsewhere = tmp_path / "data", tmp_path / "indexes"
    data.mkdir()
    paths = [make_criteo(data / "day_0", 2500, seed=3)["path"]]
    before = sorted(os.listdir(data))
    read_only(monkeypatch, data)
    monkeypatch.setenv(index_store.INDEX_DIR_ENV, str(elsewhere))
    with caplog.at_level("WARNING", logger="feedline"):
        loader = Loader(criteo(str(data / "day_*")), batch_size=500, placement="cpu", seed=2)
        assert rows_and_labels(loader) == (list(range(2500)), file_labels(paths))
    loader.close()
    assert sorted(os.listdir(data)) == before
    kept = [name for _, _, names in os.walk(elsewhere) for name in names]
    assert kept and not any("cannot keep" in r.getMessage() for r in caplog.records)
    index_store.forget_memory()  # a new process: only what is on disk is known
    again = Loader(criteo(str(data / "day_*")), batch_size=500, placement="cpu", seed=2)
    assert rows_and_labels(again) == (list(range(2500)), file_labels(paths))
    again.close()
    assert sorted(name for _, _, names in os.walk(elsewhere) for name in names) == sorted(kept)


def test_shards_in_a_read_only_folder_give_every_sample(tmp_path, monkeypatch):
    data = tmp_path / "shards"
    data.mkdir()
    for k in range(2):
        (data / f"train-{k}.tar").write_bytes(ht.shard_bytes(range(4 * k, 4 * k + 4)))
    before = sorted(os.listdir(data))
    refused = read_only(monkeypatch, data)
    loader = Loader(image.val(str(data / "train-*"), size=16, output="uint8"), batch_size=3, placement="cpu")
    batches = list(loader)
    assert torch.cat([b["index"][b["valid"]] for b in batches]).tolist() == list(range(8))
    assert torch.cat([b["label"][b["valid"]] for b in batches]).tolist() == [k % 3 for k in range(8)]
    assert refused and sorted(os.listdir(data)) == before
