"""Caching an image pipeline's deterministic prefix (issue 22): the decision (Cachew's rule, in words with its
figures), and batches bit-identical to the uncached pipeline's for image.val (whole output kept) and image.train
(decoded images kept), over epochs, a resume, ranks and skips; a disk store reused by the next Loader and not
trusted once a file is rewritten; a store too slow to read is not used."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import write_images
from feedline.loader import Loader
from feedline.loader.cache_policy import CacheMode, CacheSettings, decide
from feedline.loader.runners import image_cache
from feedline.loader.runners.image_cache import DECODED, OUTPUT, cache_kind, cacheable_prefix
from feedline.pipelines import image

pytest.importorskip("nvidia.dali")

SIZES = [(96 + 8 * (i % 5), 80 + 12 * (i % 4)) for i in range(18)]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache_images")
    write_images(root, len(SIZES), classes=3, seed=5, sizes=SIZES)
    return root


def run(spec, epochs=2, cache="off", **kwargs):
    """Every epoch's batches (copied to the CPU) and the Loader's cache report after each."""
    out, reports = [], []
    with Loader(spec, 4, placement="cpu", num_threads=2, cache=cache, **kwargs) as loader:
        for _ in range(epochs):
            out.append([{k: v.clone() for k, v in b.items()} for b in loader])
            reports.append(loader.plan["cache"])
    return out, reports


def same(a, b):
    assert [len(e) for e in a] == [len(e) for e in b]
    for ea, eb in zip(a, b):
        for x, y in zip(ea, eb):
            assert sorted(x) == sorted(y)
            for k in x:
                assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), k


# ---- the decision -----------------------------------------------------------------------------------------
def test_decide_follows_cachews_rule_and_says_why_with_the_figures():
    auto = CacheSettings()
    used = decide(what="val", recompute_s=0.004, read_s=0.0002, bytes_needed=1 << 20, settings=auto,
                  space_bytes=1 << 30)
    assert used.use and "4.000 ms" in used.reason and "0.200 ms" in used.reason and "20.0x" in used.reason
    slow = decide(what="val", recompute_s=0.001, read_s=0.002, bytes_needed=1 << 20, settings=auto,
                  space_bytes=1 << 30)
    assert not slow.use and "would not pay" in slow.reason and slow.read_s == 0.002
    big = decide(what="val", recompute_s=1.0, read_s=0.0, bytes_needed=3 << 20, settings=auto, space_bytes=2 << 20)
    assert not big.use and "does not fit" in big.reason and "3.0 MiB" in big.reason and "2.0 MiB" in big.reason
    on = CacheSettings(mode="on")
    assert decide(what="v", recompute_s=0.001, read_s=0.01, bytes_needed=10, settings=on, space_bytes=10).use
    assert not decide(what="v", recompute_s=0.001, read_s=0.01, bytes_needed=11, settings=on, space_bytes=10).use
    off = decide(what="v", recompute_s=9.0, read_s=0.0, bytes_needed=1, settings=CacheSettings(CacheMode.OFF),
                 space_bytes=10)
    assert not off.use and "cache='off'" in off.reason


@pytest.mark.parametrize("bad,error", [("sometimes", ValueError), (1, TypeError), (True, TypeError)])
def test_loader_cache_argument_is_checked(images, bad, error):
    with pytest.raises(error, match="cache must be"):
        Loader(image.val(images, size=32), 4, placement="cpu", cache=bad)


def test_cache_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="CacheSettings.memory_bytes"):
        CacheSettings(memory_bytes=-1)
    with pytest.raises(ValueError, match="CacheSettings.mode"):
        CacheSettings(mode="maybe")
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="must be a folder"):
        CacheSettings(directory=tmp_path / "f")
    with pytest.raises(ValueError, match="decoded_max_side"):
        CacheSettings(decoded_max_side=64)  # changes pixels: only with mode ON


def test_the_cacheable_prefix_ends_at_the_first_random_or_undeclared_custom_stage(images):
    val, train = image.val(images, size=32), image.train(images, size=32)
    assert cacheable_prefix(val.stages[1:]) == 4 and cache_kind(val.stages[1:]) == OUTPUT
    assert cacheable_prefix(train.stages[1:]) == 1 and cache_kind(train.stages[1:]) == DECODED
    stages = [image.decode(), image.resize((40, 40)), image.custom(lambda x: x), image.normalize()]
    assert cacheable_prefix(image.pipeline(images, stages).stages[1:]) == 2
    stages[2] = image.custom(lambda x: x, deterministic=True)
    assert cacheable_prefix(image.pipeline(images, stages).stages[1:]) == 4


# ---- the same batches ------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", ["val", "train"])
def test_cached_batches_are_bit_identical_over_two_epochs(images, recipe):
    spec = getattr(image, recipe)(images, size=32)
    plain, _ = run(spec, epochs=3)
    cached, reports = run(spec, epochs=3, cache="on")
    same(plain, cached)
    assert reports[0]["kind"] == (OUTPUT if recipe == "val" else DECODED)
    assert reports[-1]["use"] and reports[-1]["samples_held"] == len(SIZES)
    assert reports[-1]["reason"].startswith("cached: cache='on' and it fits")


@pytest.mark.parametrize("recipe", ["val", "train"])
def test_a_resume_with_the_cache_gives_the_uncached_batches(images, recipe, tmp_path):
    spec = getattr(image, recipe)(images, size=32)
    plain, _ = run(spec, epochs=2)
    settings = CacheSettings(mode="on", directory=tmp_path / "cache")
    with Loader(spec, 4, placement="cpu", num_threads=2, cache=settings) as first:
        assert len(list(first)) == len(plain[0])
        it = iter(first)
        head = [next(it) for _ in range(2)]
        state = first.state_dict()
    with Loader(spec, 4, placement="cpu", num_threads=2, cache=settings) as second:
        second.load_state_dict(state)
        tail = list(second)
        assert second.plan["cache"]["use"]  # the disk store the first Loader filled
    same([plain[1]], [[{k: v.clone() for k, v in b.items()} for b in head] + tail])


@pytest.mark.parametrize("recipe,shuffle", [("val", False), ("val", True), ("train", True)])
def test_ranks_with_the_cache_deliver_every_sample_once_as_without(images, recipe, shuffle):
    spec = getattr(image, recipe)(images, size=32)
    seen = [[] for _ in range(3)]
    for rank in range(2):
        plain, _ = run(spec, epochs=3, shuffle=shuffle, rank=rank, world_size=2)
        cached, reports = run(spec, epochs=3, cache="on", shuffle=shuffle, rank=rank, world_size=2)
        same(plain, cached)
        assert reports[-1]["use"]
        for e, batches in enumerate(cached):
            seen[e] += [i for b in batches for i in b["index"].tolist() if i >= 0]
    assert all(sorted(s) == list(range(len(SIZES))) for s in seen)


def test_a_bad_file_stays_skipped_and_is_listed_once(images, tmp_path):
    root = tmp_path / "bad"
    paths = write_images(root, 10, classes=2, seed=3, sizes=SIZES[:10])
    paths[4].write_bytes(paths[4].read_bytes()[:300])
    for recipe in ("val", "train"):
        spec = getattr(image, recipe)(root, size=32, on_error="skip")
        plain, _ = run(spec, epochs=3)
        with Loader(spec, 4, placement="cpu", num_threads=2, cache="on") as loader:
            cached = [[{k: v.clone() for k, v in b.items()} for b in loader] for _ in range(3)]
            assert [s.where for s in loader.skipped] == [str(paths[4])]
            assert loader.plan["cache"]["use"]
        same(plain, cached)


# ---- measured decisions --------------------------------------------------------------------------------
def test_a_store_too_slow_to_read_is_not_used_and_the_decision_says_so(images, monkeypatch):
    spec = image.val(images, size=32)
    plain, _ = run(spec, epochs=2)
    get = image_cache.RamStore.get

    def slow_get(self, index):
        time.sleep(0.05)  # a slow cache device: 50 ms a sample, far more than decoding a small image
        return get(self, index)

    monkeypatch.setattr(image_cache.RamStore, "get", slow_get)
    cached, reports = run(spec, epochs=2, cache="auto")
    same(plain, cached)
    decision = reports[-1]
    assert decision["use"] is False and decision["measured"]
    assert "would not pay" in decision["reason"] and decision["read_s"] >= 0.05 > decision["recompute_s"]
    assert decision["samples_held"] == 0  # dropped


def test_auto_uses_a_store_that_pays_and_plan_shows_it(images):
    spec = image.val(images, size=32)
    _, reports = run(spec, epochs=2, cache="auto")
    assert not reports[0]["measured"] or reports[0]["use"] is not None
    final = reports[-1]
    assert final["use"] and final["recompute_s"] > final["read_s"] and "more to recompute" in final["reason"]
    assert final["bytes_needed"] == len(SIZES) * 32 * 32 * 3 * 4  # float32 CHW rows


# ---- the disk store: reused, and invalidated --------------------------------------------------------------
def test_a_disk_store_is_reused_by_the_next_loader_and_not_trusted_after_a_rewrite(tmp_path, monkeypatch):
    root = tmp_path / "imgs"
    paths = write_images(root, 8, classes=2, seed=9, sizes=SIZES[:8])
    spec = image.val(root, size=32)
    settings = CacheSettings(mode="on", directory=tmp_path / "cache")
    first, _ = run(spec, epochs=1, cache=settings)
    stores = os.listdir(tmp_path / "cache")
    assert len(stores) == 1 and sorted(os.listdir(tmp_path / "cache" / stores[0])) == \
        ["index.npz", "meta.json", "records.bin"]

    from feedline.loader.sources.image_files import ImageFiles

    def no_reads(self, index, max_pixels=0):
        raise AssertionError("a file was read although the store holds every sample")

    with monkeypatch.context() as m:
        m.setattr(ImageFiles, "read_checked", no_reads)
        again, reports = run(spec, epochs=1, cache=settings)
    same(first, again)
    assert reports[0]["use"] and reports[0]["where"].startswith(str(tmp_path / "cache"))

    time.sleep(0.01)
    Image.fromarray(np.full((90, 100, 3), 200, np.uint8)).save(paths[0], quality=92)  # rewritten in place
    plain, _ = run(spec, epochs=1)
    after, _ = run(spec, epochs=1, cache=settings)
    same(plain, after)
    assert not torch.equal(plain[0][0]["image"], first[0][0]["image"])
    assert len(os.listdir(tmp_path / "cache")) == 2  # a new key; the old store is not read


def test_default_auto_changes_no_bit(images):
    spec = image.train(images, size=32)
    off, _ = run(spec, epochs=2)
    auto, reports = run(spec, epochs=2, cache="auto")
    same(off, auto)
    # Decoded training images are kept only when asked for: filling them costs the first epoch whole decodes.
    assert reports[-1]["use"] is False and "only with cache='on'" in reports[-1]["reason"]
    _, reports = run(spec, epochs=2, cache="on")
    assert reports[-1]["use"] is True and reports[-1]["kind"] == DECODED


# ---- capped decoded images (opt-in, FFCV-style) -----------------------------------------------------------
def test_capped_decoded_images_differ_from_the_uncached_pipeline_by_the_stated_amount(images):
    spec = image.train(images, size=32, output="uint8")
    plain, _ = run(spec, epochs=2)
    settings = CacheSettings(mode="on", decoded_max_side=64)
    with Loader(spec, 4, placement="cpu", num_threads=2, cache=settings) as loader:
        capped = [[{k: v.clone() for k, v in b.items()} for b in loader] for _ in range(2)]
        store = loader.runner.store
        held = [store.get(i).shape for i in range(len(SIZES))]
    assert all(max(h, w) <= 64 and c == 3 for h, w, c in held)
    assert all(max(h, w) == 64 for h, w, _ in held)  # every test image is larger than the cap
    again, _ = run(spec, epochs=2, cache=settings)
    same(capped, again)  # the same capped pixels every run and epoch
    diff = torch.cat([(a["image"].float() - b["image"].float()).abs().flatten()
                      for ea, eb in zip(plain, capped) for a, b in zip(ea, eb)])
    for ea, eb in zip(plain, capped):
        for a, b in zip(ea, eb):
            assert torch.equal(a["index"], b["index"]) and torch.equal(a["label"], b["label"])
    # Stated in the README: a mean absolute difference of a fraction of a level of 255 here (smooth images, 32-pixel
    # crops of images capped at 64), 2.6 levels for make-data's photos at 224 capped at 256: above zero, and
    # a small fraction of the difference between the crops of different images.
    unrelated = torch.cat([(a["image"].float() - a["image"].roll(1, 0).float()).abs().flatten()
                           for e in plain for a in e])
    assert 0.05 < diff.mean().item() < unrelated.mean().item() / 20, (diff.mean(), unrelated.mean())


def test_capping_is_refused_where_the_whole_output_is_kept(images):
    with pytest.raises(ValueError, match="whole output is kept"):
        Loader(image.val(images, size=32), 4, placement="cpu", cache=CacheSettings(mode="on", decoded_max_side=64))


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["val", "train"])
def test_cached_batches_on_the_gpu_are_bit_identical(images, recipe):
    """nvJPEG decoding the whole image then ``fn.slice`` on the GPU gives what decoding the window gives."""
    spec = getattr(image, recipe)(images, size=32)

    def gpu_run(cache):
        with Loader(spec, 4, placement="gpu", device="cuda", num_threads=2, cache=cache) as loader:
            return [[{k: v.cpu() for k, v in b.items()} for b in loader] for _ in range(2)], loader.plan["cache"]

    plain, _ = gpu_run("off")
    cached, report = gpu_run("on")
    same(plain, cached)
    assert report["use"]


def test_two_writers_of_one_disk_store_leave_one_whole_store(tmp_path):
    """Two ranks (or runs) filling the same key: the first to finish is moved into place in one step; the other
    drops its own records and reads that store, so no reader meets one writer's index over another's records."""
    folder = str(tmp_path / "key")
    a, b = image_cache.DiskStore(folder, 1 << 20, np.uint8), image_cache.DiskStore(folder, 1 << 20, np.uint8)
    for index in range(3):
        a.put(index, np.full((2, 3, 3), index, np.uint8))
    for index in reversed(range(3)):  # another order: other offsets
        b.put(index, np.full((2 + index, 3, 3), 10 + index, np.uint8))
    assert not os.path.exists(folder)
    assert a.finish(3, 0.001) and b.finish(3, 0.002)
    assert sorted(os.listdir(tmp_path)) == ["key"]
    for store in (a, b, image_cache.DiskStore(folder, 0, np.uint8)):
        assert store.complete and store.recompute_s == 0.001
        assert [store.get(i).tolist() for i in range(3)] == [np.full((2, 3, 3), i, np.uint8).tolist()
                                                             for i in range(3)]


def test_the_profile_notes_the_decision(images):
    with Loader(image.val(images, size=32), 4, placement="cpu", num_threads=2, cache="on") as loader:
        for _ in range(2):
            list(loader)
        notes = loader.profile(batches=2).notes
    assert any(n.startswith("cache: cached: cache='on' and it fits") for n in notes), notes
