"""Fuzzing the image reader with a fixed budget: 10,000 files of fuzzed bytes among good JPEGs in an
ImageFolder, read by ``image.val`` on the CPU.

The contract (README, "Bad data"): with ``on_error="skip"`` every good file arrives exactly once and every
other file is listed exactly once in ``loader.skipped`` with a reason, and nothing else is raised; with
``on_error="raise"`` the error is a ``DataError`` naming the file. The loader runs in a child process under a
timeout, so that a hang or a crash inside a native decoder fails the test instead of stalling or killing CI.

Every file is a pure function of ``(seed, number)``. A failure names the seed, the file and its kind;
``python tests/test_fuzz_images.py payload SEED NUMBER OUT`` writes that one file again. Environment:
``FEEDLINE_FUZZ_SEED`` (another seed), ``FEEDLINE_FUZZ_IMAGES`` (how many fuzzed files).

Budget: a file that passes the header check but that DALI cannot decode fails its whole batch, and the
runner then rebuilds the pipeline and re-reads every pending sample (``batch_size * prefetch`` of them), so
each such file costs time in proportion to the batch size: 4 to 12 ms at batch 8, 20 ms and more at batch 64
on two cores. About 1,500 of the 10,000 files are of that kind, hence batch 8 and the shares below (the epoch
takes about 20 s on an idle 2-core machine). Batches of 64 are exercised by
``test_files_the_decoder_cannot_parse_do_not_crash_a_full_batch``.
"""
from __future__ import annotations

import functools
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

SEED = int(os.environ.get("FEEDLINE_FUZZ_SEED", "20251202"))
NUM_FUZZED = int(os.environ.get("FEEDLINE_FUZZ_IMAGES", "10000"))
GOOD_EVERY = 4        # a good JPEG before every 4th fuzzed file
CLASSES = ("a", "b")  # fuzzed file k goes to class k % 2 (labels are checked too)
BATCH_SIZE = 8
SIZE = 16
RAISE_PER_KIND = 4    # files of each kind also read with on_error="raise", one loader each
TIMEOUT_S = 240       # generous: a hang fails the test instead of stalling CI

# kind -> (share of the fuzzed files, what a correct loader does: "good" delivers it, "bad" skips it,
# "either" may do one or the other, but exactly one, once)
KINDS = {
    "empty": (0.02, "bad"),
    "random": (0.16, "bad"),         # random bytes of random length (decided "either" if they open with a magic)
    "jpeg_magic": (0.10, "bad"),     # a JPEG signature, then random bytes
    "png_magic": (0.07, "bad"),      # a PNG signature, then random bytes
    "truncated": (0.16, "bad"),      # a real JPEG or PNG cut at a random point ("either" for the end marker)
    "flipped": (0.14, "either"),     # a real JPEG or PNG with 1..8 random bytes changed
    "garbage": (0.08, "either"),     # a real JPEG or PNG with 1..64 random bytes inserted
    "valid": (0.27, "good"),         # a tiny valid image of an odd size, in each format the header check takes
}
_KIND_NAMES = tuple(KINDS)
_KIND_P = np.array([share for share, _ in KINDS.values()])
_KIND_P = _KIND_P / _KIND_P.sum()

# Signatures of the formats the header check accepts (a random file that starts with one may be valid).
_MAGICS = (b"\xff\xd8", b"\x89PNG", b"BM", b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+", b"RIFF", b"P1", b"P2",
           b"P3", b"P4", b"P5", b"P6", b"P7", b"Pf", b"PF", b"\x00\x00\x00\x0cjP", b"\xff\x4f\xff\x51")
_ODD_SIZES = ((1, 1), (1, 2), (2, 1), (1, 17), (17, 1), (3, 5), (7, 3), (2, 301), (301, 2), (15, 16), (16, 15),
              (17, 17), (31, 9))


def _encode(im: Image.Image, fmt: str, **save) -> bytes:
    out = io.BytesIO()
    im.save(out, format=fmt, **save)
    return out.getvalue()


def _pixels(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """Smooth colour gradients (they compress like photos) plus a little noise."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    a, b, c = rng.uniform(-0.5, 0.5, (3, 3))
    img = 128 + 90 * np.sin(a * xx[..., None] + b * yy[..., None] + c * 6)
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


@functools.lru_cache(maxsize=4)
def bases(seed: int) -> tuple[bytes, ...]:
    """The real files that mutations start from."""
    rng = np.random.default_rng([seed, 1 << 40])
    photo = Image.fromarray(_pixels(rng, 48, 40))
    return (_encode(photo, "JPEG", quality=85),
            _encode(Image.fromarray(_pixels(rng, 40, 48)), "JPEG", quality=92, subsampling=0),
            _encode(Image.fromarray(_pixels(rng, 32, 24)), "JPEG", quality=80, progressive=True),
            _encode(photo.convert("L"), "JPEG", quality=85),
            _encode(Image.fromarray(_pixels(rng, 24, 20)), "PNG"))


@functools.lru_cache(maxsize=4)
def good_jpeg(seed: int) -> bytes:
    return _encode(Image.fromarray(_pixels(np.random.default_rng([seed, 1 << 41]), 40, 32)), "JPEG", quality=90)


def _valid(rng: np.random.Generator) -> tuple[bytes, str]:
    w, h = _ODD_SIZES[rng.integers(len(_ODD_SIZES))] if rng.random() < 0.6 else rng.integers(1, 41, 2).tolist()
    im = Image.fromarray(_pixels(rng, int(w), int(h)))
    form = int(rng.integers(13))
    if form == 0:
        return _encode(im, "JPEG", quality=int(rng.integers(5, 100))), ".jpg"
    if form == 1:
        return _encode(im, "JPEG", quality=90, subsampling=0), ".jpg"
    if form == 2:
        return _encode(im, "JPEG", quality=90, progressive=True), ".jpeg"
    if form == 3:
        return _encode(im.convert("L"), "JPEG"), ".jpg"
    if form == 4:
        return _encode(im.convert("CMYK"), "JPEG"), ".jpg"
    if form == 5:
        exif = Image.Exif()
        exif[0x0112] = int(rng.integers(1, 9))  # any EXIF orientation
        return _encode(im, "JPEG", exif=exif.tobytes()), ".jpg"
    if form == 6:
        return _encode(im, "PNG"), ".jpg"  # PNG named .jpg (documented as good)
    if form == 7:
        return _encode(im.convert(("RGBA", "L", "LA", "P", "1")[rng.integers(5)]), "PNG"), ".png"
    if form == 8:
        return _encode(Image.fromarray(np.asarray(im)[..., 0].astype(np.uint16) * 257), "PNG"), ".png"  # 16-bit
    if form == 9:
        return _encode(im, "BMP"), ".bmp"
    if form == 10:
        return _encode(im, "TIFF"), ".tif"
    if form == 11:
        return _encode(im, "WEBP", quality=80), ".webp"
    return _encode(im, "WEBP", lossless=True), ".webp"


def payload(seed: int, number: int) -> tuple[str, str, bytes, str]:
    """Fuzzed file ``number`` of ``seed``: (kind, extension, bytes, expected outcome)."""
    rng = np.random.default_rng([seed, number])
    kind = _KIND_NAMES[rng.choice(len(_KIND_NAMES), p=_KIND_P)]
    expected = KINDS[kind][1]
    ext = ".jpg"
    base = bases(seed)[rng.integers(len(bases(seed)))]
    if kind == "empty":
        data = b""
    elif kind == "random":
        data = rng.bytes(int(rng.integers(1, 4097)) if rng.random() < 0.8 else int(rng.integers(1, 9)))
        if data.startswith(_MAGICS):
            expected = "either"
    elif kind == "jpeg_magic":
        data = b"\xff\xd8\xff" + rng.bytes(int(rng.integers(0, 2049)))
    elif kind == "png_magic":
        data = b"\x89PNG\r\n\x1a\n" + rng.bytes(int(rng.integers(0, 2049)))
    elif kind == "truncated":
        cut = int(rng.integers(0, len(base)))
        data = base[:cut]
        tail = 12 if base.startswith(b"\x89PNG") else 2  # the end marker (PNG: the IEND chunk)
        if cut >= len(base) - tail:
            expected = "either"
    elif kind == "flipped":
        buf = bytearray(base)
        for at in rng.integers(0, len(buf), int(rng.integers(1, 9))).tolist():
            buf[at] = int(rng.integers(256))
        data = bytes(buf)
    elif kind == "garbage":
        at = int(rng.integers(0, len(base) + 1))
        data = base[:at] + rng.bytes(int(rng.integers(1, 65))) + base[at:]
    else:
        data, ext = _valid(rng)
    return kind, ext, data, expected


def write_folder(root: Path, seed: int, count: int) -> dict[str, dict]:
    """The fuzzed files and, before every ``GOOD_EVERY``-th, a good JPEG, in ImageFolder layout. Returns
    path -> {number, kind, expected, label} (number -1: a good JPEG)."""
    manifest = {}
    good = good_jpeg(seed)
    for label, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
    for k in range(count):
        label = k % len(CLASSES)
        folder = root / CLASSES[label]
        if k % GOOD_EVERY == 0:
            path = folder / f"{k:05d}_0good.jpg"
            path.write_bytes(good)
            manifest[str(path)] = {"number": -1, "kind": "good_jpeg", "expected": "good", "label": label}
        kind, ext, data, expected = payload(seed, k)
        path = folder / f"{k:05d}_{kind}{ext}"
        path.write_bytes(data)
        manifest[str(path)] = {"number": k, "kind": kind, "expected": expected, "label": label}
    return manifest


# ---- the child process ------------------------------------------------------------------------------------

def _worker(folder: str, out: str, batch_size: int, raise_targets: list[str], good: str, raise_batch: int
            ) -> None:
    """Read ``folder`` with on_error="skip", then each of ``raise_targets`` with on_error="raise" (first in a
    file list of ``raise_batch`` files, the others good JPEGs, in one batch); write what happened to ``out``
    as JSON. Progress goes to ``out + '.log'`` so that a crash still says how far it got."""
    import logging
    import traceback

    import torch
    from feedline.loader import DataError, Loader
    from feedline.pipelines import image

    logging.getLogger("feedline").setLevel(logging.ERROR)  # one warning per skipped file otherwise
    with open(out + ".log", "w", buffering=1) as progress:
        result: dict = {}
        began = time.perf_counter()
        try:
            loader = Loader(image.val(folder, size=SIZE, output="uint8"), batch_size=batch_size, placement="cpu",
                            on_error="skip", shuffle=False)
            paths = list(loader.source.paths)
            delivered, labels, problems = [], [], []
            for batch in loader:
                valid = batch["valid"] if "valid" in batch else torch.ones(len(batch["index"]), dtype=torch.bool)
                if batch["image"].shape[1:] != (SIZE, SIZE, 3) or batch["image"].dtype != torch.uint8:
                    problems.append(f"image batch {tuple(batch['image'].shape)} {batch['image'].dtype}")
                if len(batch["label"]) != len(batch["index"]) or len(valid) != len(batch["index"]):
                    problems.append("label/index/valid lengths differ")
                delivered += batch["index"][valid].tolist()
                labels += batch["label"][valid].tolist()
                progress.write(f"delivered {delivered[-1] if delivered else None}\n")
            result["skip"] = {
                "paths": paths, "delivered": delivered, "labels": labels, "problems": problems,
                "skipped": [[s.where, s.reason, s.index, s.epoch] for s in loader.skipped],
                "summaries": {str(k): v for k, v in loader.epoch_summaries.items()},
                "seconds": time.perf_counter() - began}
            loader.close()
        except BaseException as exc:  # noqa: BLE001  (anything but a clean epoch breaks the contract)
            result["skip_error"] = "".join(traceback.format_exception(exc))
        began = time.perf_counter()
        outcomes = {}
        for n, target in enumerate(raise_targets):
            progress.write(f"raise {target}\n")
            listing = Path(out).with_name(f"raise_{n}.txt")
            listing.write_text(f"{target} 1\n" + f"{good} 0\n" * (raise_batch - 1))
            try:
                loader = Loader(image.val(str(listing), size=SIZE, output="uint8"), batch_size=raise_batch,
                                placement="cpu", on_error="raise", shuffle=False)
                got = [i for b in loader for i in b["index"].tolist()]
                outcomes[target] = {"delivered": got}
                loader.close()
            except DataError as err:
                outcomes[target] = {"data_error": [type(err).__name__, err.where, err.reason]}
            except BaseException as exc:  # noqa: BLE001  (recorded: anything but a DataError breaks the contract)
                outcomes[target] = {"other_error": "".join(traceback.format_exception(exc))}
    result["raise"] = outcomes
    result["raise_seconds"] = time.perf_counter() - began
    Path(out).write_text(json.dumps(result))


def run_worker(folder: Path, out: Path, raise_targets: list[str], good: str, timeout: float, *,
               batch_size: int = BATCH_SIZE, raise_batch: int = 3) -> dict:
    """The worker in a child process; fails the test on a hang, a crash or a missing result."""
    spec = {"folder": str(folder), "out": str(out), "batch_size": batch_size, "raise_targets": raise_targets,
            "good": good, "raise_batch": raise_batch}
    (out.parent / "spec.json").write_text(json.dumps(spec))
    try:
        done = subprocess.run([sys.executable, __file__, "worker", str(out.parent / "spec.json")],
                              check=False, capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the loader did not finish within {timeout:.0f} s (hang?); seed {SEED}, folder {folder}; "
                    f"last progress: {_last_lines(Path(str(out) + '.log'))}")
    if done.returncode != 0 or not out.exists():
        died = f"signal {signal.Signals(-done.returncode).name}" if done.returncode < 0 else f"exit {done.returncode}"
        stderr = [line for line in done.stderr.splitlines() if "Traceback" in line or "Error" in line
                  or line.startswith("  File")][-25:]
        pytest.fail(f"the loader's process died ({died}) before finishing; seed {SEED}, folder {folder}; "
                    f"last progress: {_last_lines(Path(str(out) + '.log'))}\n" + "\n".join(stderr))
    return json.loads(out.read_text())


def _last_lines(path: Path, n: int = 2) -> str:
    try:
        return " | ".join(path.read_text().splitlines()[-n:]) or "none (before the first batch)"
    except OSError:
        return "none"


# ---- the tests --------------------------------------------------------------------------------------------

def _raise_targets(manifest: dict[str, dict]) -> list[str]:
    """A few files of every kind, chosen by the seed."""
    rng = np.random.default_rng([SEED, 1 << 42])
    by_kind: dict[str, list[str]] = {}
    for path, entry in manifest.items():
        if entry["number"] >= 0:
            by_kind.setdefault(entry["kind"], []).append(path)
    targets = []
    for kind in _KIND_NAMES:
        paths = by_kind.get(kind, [])
        targets += [paths[i] for i in sorted(rng.choice(len(paths), min(RAISE_PER_KIND, len(paths)), replace=False))]
    return targets


def check_contract(manifest: dict[str, dict], result: dict, targets: list[str], raise_batch: int) -> dict:
    """Every assertion of the contract on a worker's result; returns the skip run's summary."""

    def where(path: str) -> str:
        e = manifest[path]
        again = (f"; rewrite it: python tests/test_fuzz_images.py payload {SEED} {e['number']} OUT"
                 if e["number"] >= 0 else "")
        return f"{path} (seed {SEED}, file {e['number']}, kind {e['kind']}, expected {e['expected']}{again})"

    assert "skip_error" not in result, f"on_error='skip' raised (seed {SEED}):\n{result.get('skip_error')}"
    skip = result["skip"]
    paths = skip["paths"]
    assert sorted(paths) == sorted(manifest), "the loader listed other files than were written"
    assert not skip["problems"], skip["problems"][:5]

    # Every file is delivered once or skipped once: never both, never neither, never twice.
    delivered = Counter(skip["delivered"])
    twice = [paths[i] for i, n in delivered.items() if n > 1]
    assert not twice, f"{len(twice)} files delivered more than once, e.g. {where(twice[0])}"
    skipped = Counter(s[0] for s in skip["skipped"])
    listed_twice = [p for p, n in skipped.items() if n > 1]
    assert not listed_twice, f"{len(listed_twice)} files listed twice in skipped, e.g. {where(listed_twice[0])}"
    unknown = [p for p in skipped if p not in manifest]
    assert not unknown, f"skipped names files that were not written: {unknown[:3]}"
    both = [paths[i] for i in delivered if paths[i] in skipped]
    assert not both, f"{len(both)} files both delivered and skipped, e.g. {where(both[0])}"
    lost = [p for k, p in enumerate(paths) if k not in delivered and p not in skipped]
    assert not lost, f"{len(lost)} files neither delivered nor skipped, e.g. {where(lost[0])}"

    # A skipped entry names the file, its index and the epoch, and says why.
    for path, reason, index, epoch in skip["skipped"]:
        assert index is not None and paths[index] == path and epoch == 0, (where(path), index, epoch)
        assert isinstance(reason, str) and reason.strip(), f"no reason given for {where(path)}"
    assert skip["summaries"]["0"]["skipped"] == len(skipped), skip["summaries"]
    assert skip["summaries"]["0"]["samples"] == len(delivered), skip["summaries"]
    # Labels travel with their files.
    wrong = [paths[i] for i, label in zip(skip["delivered"], skip["labels"]) if manifest[paths[i]]["label"] != label]
    assert not wrong, f"{len(wrong)} files delivered with another label, e.g. {where(wrong[0])}"

    # What must arrive arrives; what must be left out is, with the documented reason.
    reasons = {s[0]: s[1] for s in skip["skipped"]}
    not_delivered = [p for p, e in manifest.items() if e["expected"] == "good" and p in skipped]
    assert not not_delivered, f"{len(not_delivered)} valid files were skipped, e.g. {where(not_delivered[0])}: " \
                              f"{reasons[not_delivered[0]]}"
    not_skipped = [p for p, e in manifest.items() if e["expected"] == "bad" and p not in skipped]
    assert not not_skipped, f"{len(not_skipped)} bad files were delivered, e.g. {where(not_skipped[0])}"
    for path, e in manifest.items():
        if e["kind"] == "empty":
            assert "empty" in reasons[path], (where(path), reasons[path])

    # on_error="raise": a DataError naming the file exactly where "skip" left it out, else every file arrives.
    for target in targets:
        outcome = result["raise"][target]
        assert "other_error" not in outcome, f"on_error='raise' raised something else for {where(target)}:\n" \
                                             f"{outcome['other_error']}"
        if target in skipped:
            assert "data_error" in outcome, f"on_error='raise' did not raise for {where(target)}: {outcome}"
            assert outcome["data_error"][1] == target, (where(target), outcome["data_error"])
            assert outcome["data_error"][2].strip(), where(target)
        else:
            assert outcome.get("delivered") == list(range(raise_batch)), (where(target), outcome)
    return {"delivered": len(delivered), "skipped": len(skipped), "seconds": skip["seconds"]}


@pytest.mark.slow
def test_fuzzed_image_files_are_delivered_or_named(tmp_path):
    began = time.perf_counter()
    root = tmp_path / "images"
    manifest = write_folder(root, SEED, NUM_FUZZED)
    written = time.perf_counter() - began
    good = str(tmp_path / "good.jpg")
    Path(good).write_bytes(good_jpeg(SEED))
    targets = _raise_targets(manifest)
    result = run_worker(root, tmp_path / "result.json", targets, good, TIMEOUT_S)
    summary = check_contract(manifest, result, targets, raise_batch=3)
    kinds = Counter(e["kind"] for e in manifest.values())
    print(f"\nfuzz seed {SEED}: {len(manifest)} files {dict(kinds)}, written in {written:.1f} s; skip epoch "
          f"{summary['seconds']:.1f} s ({len(manifest) / summary['seconds']:.0f} files/s, batch {BATCH_SIZE}): "
          f"delivered {summary['delivered']}, skipped {summary['skipped']}; {len(targets)} raise checks in "
          f"{result['raise_seconds']:.1f} s; {time.perf_counter() - began:.1f} s in all")


def _cut_jpeg_before_scan(jpeg: bytes) -> bytes:
    """``jpeg`` cut where its scan (SOS) would begin: every header segment whole, no image data."""
    at = 2
    while jpeg[at + 1] != 0xDA:
        at += 2 + int.from_bytes(jpeg[at + 2:at + 4], "big")
    return jpeg[:at]


@pytest.mark.slow
def test_files_the_decoder_cannot_parse_do_not_crash_a_full_batch(tmp_path):
    """A JPEG whose headers end before the scan, and a PNG cut after its header: the header check reads their
    size, DALI's parser then fails on them, and in a batch of 64 where they come first DALI 2.4.0's CPU decoder
    crashed the process (SIGSEGV) instead of failing the batch."""
    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    base = bases(SEED)
    special = {"0_jpeg_no_scan.jpg": _cut_jpeg_before_scan(base[0]), "1_png_cut.png": base[4][:len(base[4]) // 3]}
    manifest = {}
    for name, data in special.items():
        (root / "a" / name).write_bytes(data)
        manifest[str(root / "a" / name)] = {"number": -1, "kind": name[2:-4], "expected": "bad", "label": 0}
    for k in range(62):
        (root / "a" / f"{k + 2:02d}_good.jpg").write_bytes(good_jpeg(SEED))
        manifest[str(root / "a" / f"{k + 2:02d}_good.jpg")] = {"number": -1, "kind": "good_jpeg", "expected": "good",
                                                               "label": 0}
    good = str(tmp_path / "good.jpg")
    Path(good).write_bytes(good_jpeg(SEED))
    targets = [str(root / "a" / name) for name in special]
    result = run_worker(root, tmp_path / "result.json", targets, good, 120, batch_size=64, raise_batch=64)
    check_contract(manifest, result, targets, raise_batch=64)


def _main(argv: list[str]) -> None:
    if argv[:1] == ["worker"]:
        spec = json.loads(Path(argv[1]).read_text())
        _worker(spec["folder"], spec["out"], spec["batch_size"], spec["raise_targets"], spec["good"],
                spec["raise_batch"])
    elif argv[:1] == ["payload"]:
        kind, _, data, expected = payload(int(argv[1]), int(argv[2]))
        Path(argv[3]).write_bytes(data)
        print(f"{argv[3]}: {kind}, {len(data)} bytes, expected {expected}")
    else:
        raise SystemExit(f"usage: {sys.argv[0]} worker SPEC.json | payload SEED NUMBER OUT")


if __name__ == "__main__":
    _main(sys.argv[1:])
