"""webdataset tar shards as an image source: the same samples as a folder of the same images, every way of naming
shards, sharding across ranks, resume, on_error for every bad shard or member, and the per-shard index kept in a
sidecar (tests/test_hostile_shards.py: crafted headers, caches that must not be trusted)."""
import argparse
import glob
import io
import json
import os
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

from feedline.datagen.images import make_images
from feedline.loader import DataError, Loader
from feedline import cli
from feedline.cli.arguments import existing_path
from feedline.loader.sources import index_store, open_source
from feedline.loader.sources import webdataset as wds_source
from feedline.pipelines import image
from feedline.pipelines.image_sources import FileList, ImageFolder, WebDataset, image_source
from feedline.pipelines.own_files import sidecar_name
from feedline.pipelines.shard_patterns import expand_braces

from conftest import _photo_like
from corrupt_images import payload

COUNT, CLASSES, SHARD_SIZE = 20, 3, 6
PATTERN = "train-{000000..000003}.tar"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The same 20 images as a folder (make_images) and as 4 shards (the ``make-data`` command)."""
    root = tmp_path_factory.mktemp("wds")
    make_images(root / "folder", COUNT, CLASSES, seed=0, progress=False, workers=1)
    out = root / "shards"
    assert cli.main(["make-data", "images", "--out", str(out), "--count", str(COUNT), "--classes", str(CLASSES),
                     "--format", "webdataset", "--shard-size", str(SHARD_SIZE)]) == 0
    return root / "folder", out


def test_make_data_writes_shards_and_names_the_pattern(made, capsys):
    _, out = made
    marker = json.loads((out / ".feedline-data").read_text())
    assert marker["pattern"] == str(out / PATTERN) and marker["shards"] == 4
    assert sorted(p.name for p in out.glob("*.tar")) == [f"train-{k:06d}.tar" for k in range(4)]
    with tarfile.open(out / "train-000003.tar") as tf:
        assert len(tf.getnames()) == 2 * (COUNT - 3 * SHARD_SIZE)
    with pytest.raises(SystemExit):
        cli.main(["make-data", "images", "--out", str(out / "x"), "--shard-size", "4"])  # folder format
    assert "--shard-size applies to --format webdataset" in capsys.readouterr().err


@pytest.mark.parametrize("make", [image.train, image.val])
def test_shards_give_the_same_samples_as_the_folder(made, make):
    folder, out = made
    a = Loader(make(folder, size=40), batch_size=6, placement="cpu", seed=3)
    b = Loader(make(str(out / PATTERN), size=40), batch_size=6, placement="cpu", seed=3)
    assert isinstance(b.pipeline.source, WebDataset) and len(a.source) == len(b.source) == COUNT
    assert np.array_equal(a.source.labels, b.source.labels)
    for i in range(COUNT):
        assert np.array_equal(a.source.read(i), b.source.read(i))
        assert b.source.where(i).endswith(":" + os.path.basename(a.source.where(i)))
    for _ in range(2):  # two epochs: different orders, the same on both
        batches = 0
        for x, y in zip(a, b, strict=True):
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
            batches += 1
        assert batches == len(a)


def test_pattern_glob_list_and_single_shard_name_the_same_samples(made):
    _, out = made
    shards = [out / f"train-{k:06d}.tar" for k in range(4)]
    expected = open_source(image_source(str(out / PATTERN))).paths
    for data in (str(out / "train-*.tar"), str(out / "train-00000[0-3].tar"), [str(p) for p in shards],
                 tuple(shards), str(out / "train-{000000,000001,000002,000003}.tar")):
        source = image_source(data)
        assert isinstance(source, WebDataset)
        assert open_source(source).paths == expected, data
    single = open_source(image_source(str(shards[1])))
    assert single.paths == expected[SHARD_SIZE:2 * SHARD_SIZE]
    assert isinstance(image_source(out.parent / "folder"), ImageFolder)


@pytest.mark.parametrize("pattern", ["a{0000..0127}.tar", "{07..10}", "{1..10..3}", "{4..1}", "{2..-1}",
                                     "{-05..3}", "s/{train,val}-{000..002}.tar", "python{2.{5..7},3.{2,3}}",
                                     "index{,.backup}", "{x}", "a{b{c,d}e}f", "{a..e}", "{}"])
def test_brace_expansion_equals_braceexpand(pattern):
    braceexpand = pytest.importorskip("braceexpand").braceexpand
    assert expand_braces(pattern) == list(braceexpand(pattern, escape=False))


def test_data_is_told_apart_and_bad_names_are_errors(made, tmp_path):
    folder, out = made
    listing = tmp_path / "list.txt"
    listing.write_text(f"{folder}/class_000/img_000000.jpg 0\n")
    assert isinstance(image_source(listing), FileList)
    assert isinstance(image_source(str(out / "train-000000.tar")), WebDataset)
    with pytest.raises(FileNotFoundError, match="matches no file"):
        image_source(str(out / "val-*.tar"))
    with pytest.raises(FileNotFoundError, match="matches no file"):
        image.train(str(out / "val-{0..3}.tar"))
    with pytest.raises(FileNotFoundError, match=r"train-000004\.tar.*not found"):
        image.train(str(out / "train-{000000..000004}.tar"))
    with pytest.raises(FileNotFoundError, match=r"gone\.tar"):
        image.train([str(out / "train-000000.tar"), str(out / "gone.tar")])
    with pytest.raises(FileNotFoundError, match=r"gone\.tar"):
        image.train(str(out / "gone.tar"))
    with pytest.raises(ValueError, match="data is an empty list"):
        image.train([])
    with pytest.raises(ValueError, match="unbalanced braces"):
        image.train(str(out / "train-{0..3.tar"))
    with pytest.raises(TypeError, match=r"shards\[1\]"):
        WebDataset(("a.tar", 3))


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_together_cover_every_sample_once(made, world):
    _, out = made
    spec = image.train(str(out / PATTERN), size=32, output="uint8")
    seen = []
    for rank in range(world):
        for batch in Loader(spec, batch_size=4, placement="cpu", seed=7, rank=rank, world_size=world):
            mask = batch.get("valid", torch.ones(len(batch["index"]), dtype=torch.bool))
            seen += batch["index"][mask].tolist()
    assert sorted(seen) == list(range(COUNT))


def test_resume_mid_epoch_gives_the_same_batches(made):
    _, out = made
    spec = image.train(str(out / PATTERN), size=32)
    reference = [(b["index"].clone(), b["image"].clone()) for b in Loader(spec, batch_size=4, seed=5,
                                                                           placement="cpu")]
    interrupted = Loader(spec, batch_size=4, seed=5, placement="cpu")
    it = iter(interrupted)
    for _ in range(2):
        next(it)
    resumed = Loader(spec, batch_size=4, seed=5, placement="cpu")
    resumed.load_state_dict(interrupted.state_dict())
    for (index, pixels), batch in zip(reference[2:], list(resumed), strict=True):
        assert torch.equal(index, batch["index"]) and torch.equal(pixels, batch["image"])


# Shards written by hand, for the bad cases: each sample a small JPEG and its label.

def _jpeg(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(_photo_like(np.random.default_rng(seed), 64, 48)).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def write_shard(path, members) -> None:
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def sample(key: str, seed: int, label: int = 1) -> list:
    return [(f"{key}.jpg", _jpeg(seed)), (f"{key}.cls", f"{label}\n".encode())]


def good_shard(path, first: int) -> None:
    write_shard(path, [m for k in range(first, first + 4) for m in sample(f"k{k:02d}", k, k % 2)])


def _truncate_in_last_image(path) -> None:
    with tarfile.open(path) as tf:
        last = [m for m in tf.getmembers() if m.name.endswith(".jpg")][-1]
    with open(path, "r+b") as f:
        f.truncate(last.offset_data + last.size // 2)


def _cut_between_samples(path) -> None:
    with tarfile.open(path) as tf:
        members = tf.getmembers()
    end = members[-1].offset_data + -(-members[-1].size // 512) * 512
    with open(path, "r+b") as f:
        f.truncate(end)  # every member whole, but tar's end-of-archive blocks gone


# case -> (the middle shard's members, what to do to it after writing, the bad sample's name, the reason)
BAD_SHARDS = {
    "no_cls": (sample("k04", 4) + [("k05.jpg", _jpeg(5))] + sample("k06", 6), None, "s1.tar:k05.jpg",
               "no label member k05.cls"),
    "cls_without_image": (sample("k04", 4) + [("k05.cls", b"1")] + sample("k06", 6), None, "s1.tar:k05.cls",
                          "no image member"),
    "bad_label": (sample("k04", 4) + [("k05.jpg", _jpeg(5)), ("k05.cls", b"cat\n")] + sample("k06", 6), None,
                  "s1.tar:k05.jpg", "must hold a non-negative integer"),
    "corrupt_image": (sample("k04", 4) + [("k05.jpg", payload("truncated", seed=1)), ("k05.cls", b"0")]
                      + sample("k06", 6), None, "s1.tar:k05.jpg", "corrupt or truncated"),
    "truncated_tar": (sample("k04", 4) + sample("k05", 5), _truncate_in_last_image, "s1.tar:k05.jpg",
                      "is truncated"),
    "cut_between_samples": (sample("k04", 4) + sample("k05", 5), _cut_between_samples, "s1.tar",
                            "without tar's end-of-archive blocks"),
    "empty_shard": ([], None, "s1.tar", "no samples"),
    "zero_byte_shard": ([], lambda p: open(p, "wb").close(), "s1.tar", "no samples: the shard is empty"),
}


def bad_shards(tmp_path, case) -> tuple[list[str], str]:
    members, damage, where, _ = BAD_SHARDS[case]
    paths = [str(tmp_path / f"s{k}.tar") for k in range(3)]
    good_shard(paths[0], 0)
    write_shard(paths[1], members)
    if damage is not None:
        damage(paths[1])
    good_shard(paths[2], 10)
    return paths, str(tmp_path / where)


@pytest.mark.parametrize("case", list(BAD_SHARDS))
def test_raise_names_shard_and_member(tmp_path, case):
    paths, where = bad_shards(tmp_path, case)
    with pytest.raises(DataError) as info:
        list(Loader(image.train(paths, size=32), batch_size=4, placement="cpu", shuffle=False))
    assert info.value.where == where and BAD_SHARDS[case][3] in info.value.reason


@pytest.mark.parametrize("case", list(BAD_SHARDS))
def test_skip_leaves_out_only_the_bad_sample(tmp_path, case):
    paths, where = bad_shards(tmp_path, case)
    loader = Loader(image.train(paths, size=32, output="uint8"), batch_size=4, placement="cpu", seed=1,
                    on_error="skip")
    bad = loader.source.paths.index(where)
    seen = []
    for batch in loader:
        seen += batch["index"][batch["valid"]].tolist() if "valid" in batch else batch["index"].tolist()
    assert sorted(seen) == [i for i in range(len(loader.source)) if i != bad]
    assert [(s.where, s.index) for s in loader.skipped] == [(where, bad)]
    assert BAD_SHARDS[case][3] in loader.skipped[0].reason


def test_a_shard_deleted_after_declaring_is_named(tmp_path):
    paths, _ = bad_shards(tmp_path, "no_cls")
    spec = image.train(paths, size=32)
    os.unlink(paths[2])
    with pytest.raises(FileNotFoundError, match=r"s2\.tar"):
        Loader(spec, batch_size=4, placement="cpu")


def _count_scans(monkeypatch) -> list:
    scans = []
    real = wds_source.list_members

    def counted(read_at, size):
        scans.append(size)
        return real(read_at, size)

    monkeypatch.setattr(wds_source, "list_members", counted)
    return scans


def test_index_is_cached_reused_and_rebuilt_when_the_shard_changes(tmp_path, monkeypatch, fresh_index_store):
    shard = tmp_path / "s0.tar"
    good_shard(shard, 0)
    source = WebDataset(str(shard))
    scans = _count_scans(monkeypatch)
    first = open_source(source)
    sidecar = tmp_path / sidecar_name("s0.tar", wds_source.INDEX_KIND)
    doc = json.loads(sidecar.read_text())
    assert doc["kind"] == "members" and doc["fingerprint"]["size"] == shard.stat().st_size
    members = doc["payload"]["members"]
    assert [m[0] for m in members][:2] == ["k00.jpg", "k00.cls"] and members[1][3] == "0\n"
    assert glob.glob(str(tmp_path / "*")) == [str(shard)]  # hidden: the user's globs never take it for a shard

    again = open_source(source)  # from the sidecar
    assert len(scans) == 1
    assert again.paths == first.paths and np.array_equal(again.labels, first.labels)
    assert np.array_equal(again.read(3), first.read(3))

    write_shard(shard, [m for k in range(6) for m in sample(f"n{k}", k, 2)])  # changed: 6 samples
    changed = open_source(source)
    assert len(scans) == 2 and len(changed) == 6 and changed.labels.tolist() == [2] * 6


def test_an_unwritable_folder_keeps_the_index_in_memory_and_says_so_once(tmp_path, monkeypatch, caplog,
                                                                          fresh_index_store):
    paths = [str(tmp_path / f"s{k}.tar") for k in range(2)]
    good_shard(paths[0], 0)
    good_shard(paths[1], 4)

    def read_only(target, text):  # what a read-only mount answers
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(index_store, "_write", read_only)
    with caplog.at_level("WARNING", logger="feedline"):
        first = open_source(WebDataset(tuple(paths)))
    assert sum("cannot keep" in r.message for r in caplog.records) == 1
    assert sorted(os.listdir(tmp_path)) == ["s0.tar", "s1.tar"]
    scans = _count_scans(monkeypatch)
    assert open_source(WebDataset(tuple(paths))).paths == first.paths
    assert not scans


def test_bench_and_plan_take_shard_patterns(made):
    _, out = made
    assert existing_path(str(out / PATTERN)) == str(out / PATTERN)
    with pytest.raises(argparse.ArgumentTypeError, match="matches no file"):
        existing_path(str(out / "val-*.tar"))
