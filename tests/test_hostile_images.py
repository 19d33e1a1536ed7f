"""Image folders and files that attack the reader: links that vanish or loop, files far larger than their
header says, batches of images each within ``max_pixels`` but together too many pixels, and a reader that must
leave the image library's process-wide settings alone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from feedline.loader import DataError, Loader
from feedline.pipelines import image

from conftest import write_images
from corrupt_images import payload


def _delivered(loader) -> list[int]:
    out = []
    for batch in loader:
        valid = batch.get("valid", torch.ones(len(batch["index"]), dtype=torch.bool))
        out += batch["index"][valid].tolist()
    return out


@pytest.fixture
def deadline():
    """Fails a test that takes more than the seconds given instead of letting it run forever."""
    def expired(signum, frame):
        raise TimeoutError("the test ran past its deadline (a listing that never ends?)")

    previous = signal.signal(signal.SIGALRM, expired)
    yield signal.alarm
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# ---- placement="auto" goes through the same bad-file handling as "cpu" ---------------------------------------

@pytest.mark.parametrize("case", ["dangling_link", "deleted_after_listing"])
def test_auto_placement_skips_what_cpu_skips(tmp_path, case):
    write_images(tmp_path, 7, classes=1, seed=3, sizes=[(64, 48)] * 7)
    bad = tmp_path / "class_0" / "img_0003x.jpg"
    if case == "dangling_link":
        bad.symlink_to(tmp_path / "nowhere.jpg")
    else:
        bad.write_bytes(payload("grayscale", seed=1))
    outcomes = {}
    for placement in ("cpu", "auto"):
        loader = Loader(image.train(tmp_path, size=32, output="uint8"), batch_size=4, placement=placement,
                        on_error="skip", seed=1)
        if case == "deleted_after_listing" and bad.exists():
            bad.unlink()
        outcomes[placement] = (sorted(_delivered(loader)), [(s.where, s.index) for s in loader.skipped])
        bad_index = loader.source.paths.index(str(bad))
        if case == "deleted_after_listing":
            bad.write_bytes(payload("grayscale", seed=1))
    assert outcomes["auto"] == outcomes["cpu"]
    assert outcomes["cpu"] == ([i for i in range(8) if i != bad_index], [(str(bad), bad_index)])


# ---- links in an image folder: every real directory listed once ---------------------------------------------

def _listed(root) -> list[tuple[str, int]]:
    loader = Loader(image.val(root, size=16, output="uint8"), batch_size=4, placement="cpu")
    return [(os.path.relpath(p, root), int(label)) for p, label in zip(loader.source.paths, loader.source.labels)]


def _folders(tmp_path):
    write_images(tmp_path, 4, classes=2, seed=5, sizes=[(40, 30)] * 4)  # class_0: img_0000, 0002; class_1: 0001, 0003
    return [("class_0/img_0000.jpg", 0), ("class_0/img_0002.jpg", 0), ("class_1/img_0001.jpg", 1),
            ("class_1/img_0003.jpg", 1)]


def test_a_link_to_its_own_folder_lists_nothing_twice(tmp_path, deadline):
    expected = _folders(tmp_path)
    (tmp_path / "class_0" / "again").symlink_to(tmp_path / "class_0")
    deadline(60)
    assert _listed(tmp_path) == expected


def test_links_between_two_folders_end_and_keep_each_class(tmp_path, deadline):
    """class_0/other -> class_1 and class_1/back -> class_0: the listing ends, and neither class takes the
    other's images (a link to another class's folder adds nothing)."""
    expected = _folders(tmp_path)
    (tmp_path / "class_0" / "other").symlink_to(tmp_path / "class_1")
    (tmp_path / "class_1" / "back").symlink_to(tmp_path / "class_0")
    (tmp_path / "class_1" / "deeper").mkdir()
    (tmp_path / "class_1" / "deeper" / "up").symlink_to(tmp_path)
    deadline(60)
    assert _listed(tmp_path) == expected


def test_a_linked_folder_is_followed_once(tmp_path, deadline):
    """A folder outside the root, linked twice from one class and once from another: its images are listed
    once, under the first link in sorted order; the other links add nothing."""
    expected = _folders(tmp_path)
    extra = tmp_path.parent / f"{tmp_path.name}_extra"
    write_images(extra, 2, classes=1, seed=6, sizes=[(40, 30)] * 2)
    for link, target in (("class_0/a_link", extra / "class_0"), ("class_0/b_link", extra / "class_0"),
                         ("class_1/c_link", extra / "class_0")):
        (tmp_path / link).symlink_to(target)
    deadline(60)
    assert _listed(tmp_path) == expected[:2] + [("class_0/a_link/img_0000.jpg", 0),
                                                ("class_0/a_link/img_0001.jpg", 0)] + expected[2:]


# ---- the image library's global settings, and how much of a file is read -----------------------------------

def test_using_feedline_leaves_the_image_librarys_limit_alone(tmp_path):
    write_images(tmp_path, 2, classes=1, sizes=[(40, 30)] * 2)
    code = ("from PIL import Image\n"
            "before = Image.MAX_IMAGE_PIXELS\n"
            "from feedline.loader import Loader\n"
            "from feedline.pipelines import image\n"
            f"next(iter(Loader(image.val({str(tmp_path)!r}, size=16), batch_size=2, placement='cpu')))\n"
            "print(before, Image.MAX_IMAGE_PIXELS)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = done.stdout.split()[-2:]
    assert before == after != "None"


def _bytes_read() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's per-process I/O counters")
@pytest.mark.parametrize("case", ["huge_header", "small_image_huge_file"])
def test_a_bad_header_is_found_before_the_file_is_read(tmp_path, case):
    """A header above max_pixels, or a file far larger than its header's pixels can need: a DataError after
    reading the first bytes, not the whole 200 MB."""
    folder = tmp_path / "c"
    folder.mkdir()
    path = folder / "big.jpg"
    with open(path, "wb") as f:
        f.write(payload("huge_header" if case == "huge_header" else "grayscale", seed=1))
        f.truncate(200 << 20)  # a sparse tail: reading it still counts
    loader = Loader(image.val(tmp_path, size=16), batch_size=1, placement="cpu")
    before = _bytes_read()
    with pytest.raises(DataError) as info:
        list(loader)
    assert _bytes_read() - before < (16 << 20)
    assert info.value.where == str(path)
    assert ("above the limit" if case == "huge_header" else "far more than its header") in info.value.reason


# ---- a decoded-pixel budget per batch ----------------------------------------------------------------------

def _budget_folder(tmp_path):
    """Ten images: 64x48 ones, and 400x300 ones at positions 1 and 2 (120,000 pixels each)."""
    sizes = [(64, 48), (400, 300), (400, 300)] + [(64, 48)] * 7
    write_images(tmp_path, 10, classes=1, seed=9, sizes=sizes)
    return [str(tmp_path / "class_0" / f"img_{k:04d}.jpg") for k in range(10)]


BUDGET = dict(max_pixels=150_000, max_batch_pixels=200_000)  # a share of 50,000 pixels per image of 4


def test_a_batch_over_its_pixel_budget_names_the_largest_image(tmp_path):
    paths = _budget_folder(tmp_path)
    loader = Loader(image.val(tmp_path, size=16, output="uint8"), batch_size=4, placement="cpu", **BUDGET)
    with pytest.raises(DataError, match="max_batch_pixels") as info:
        list(loader)
    assert info.value.where == paths[1]
    assert paths[2] in info.value.reason and "243072" in info.value.reason  # 3072 + 2 * 120000


def test_skip_leaves_out_only_images_above_their_share(tmp_path):
    """The large image that takes its batch over the budget is skipped and the batch filled from the next
    ordinary ones; the other large image then fits, and no ordinary image is ever left out."""
    paths = _budget_folder(tmp_path)
    loader = Loader(image.val(tmp_path, size=16, output="uint8"), batch_size=4, placement="cpu", on_error="skip",
                    **BUDGET)
    batches = list(loader)
    valid = [b["index"][b["valid"]].tolist() if "valid" in b else b["index"].tolist() for b in batches]
    assert valid == [[0, 2, 3, 4], [5, 6, 7, 8], [9]]
    assert [(s.where, s.index) for s in loader.skipped] == [(paths[1], 1)]
    assert "budget" in loader.skipped[0].reason


def test_the_default_budget_takes_a_batch_of_large_photos(tmp_path):
    paths = _budget_folder(tmp_path)
    loader = Loader(image.val(tmp_path, size=16, output="uint8"), batch_size=4, placement="cpu",
                    max_pixels=150_000)
    assert sorted(_delivered(loader)) == list(range(len(paths)))


@pytest.mark.parametrize("value", [0, 1000, 2.5, True, "many"])
def test_max_batch_pixels_is_checked(image_dir, value):
    with pytest.raises(ValueError, match="max_batch_pixels"):
        Loader(image.val(image_dir), batch_size=2, placement="cpu", max_batch_pixels=value)
