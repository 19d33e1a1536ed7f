"""Synthetic image data set whose files decode like real photos, as an ImageFolder or as webdataset tar shards.

Each image is a smooth two-colour gradient, low-frequency colour blotches, a few soft-edged
ellipses and polygons in its class's palette, and a 1/f ("pink") luminance texture with a little
sensor grain. The texture's strength is fitted per image so that each JPEG lands near a target size
within ``TARGET_KB`` that grows with the image's area, which makes decode cost resemble ImageNet
rather than flat colour or white noise. Everything derives from
``np.random.default_rng([seed, ...])`` and fixed encoder settings, so the same seed gives
byte-identical files whatever the number of worker processes (on one NumPy, Pillow and
libjpeg-turbo build: their float rounding and encoders decide the last bits).

``format="webdataset"`` writes the same images, in the order an ImageFolder of them lists them (class by class,
then by name), as tar shards ``train-000000.tar``, ... of ``shard_size`` samples each: ``img_XXXXXX.jpg`` (or
``.png``) and ``img_XXXXXX.cls`` holding the class number, written with ``webdataset.ShardWriter`` and a fixed
member time, so the same seed gives the same shard bytes too.
"""

from __future__ import annotations

import colorsys
import io
import json
import multiprocessing
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from ..pipelines.validate import int_at_least, one_of, positive_int
from tqdm import tqdm

MARKER = ".feedline-data"
MARKER_VERSION = 1
FORMATS = ("folder", "webdataset")
SHARD_PREFIX = "train"
SHARD_DIGITS = 6
DEFAULT_SHARD_SIZE = 1000
SHARD_MTIME = 946684800  # members' modification time (2000-01-01), fixed so that shards are reproducible
MIN_SIDE, MAX_SIDE = 300, 800
TARGET_KB = (55.0, 140.0)
JPEG_QUALITY = 94
PNG_COMPRESS_LEVEL = 6
GRAYSCALE_FRACTION = 0.01
PNG_FRACTION = 0.01
# Relative JPEG size error accepted before the texture strength is refitted.
SIZE_TOLERANCE = 0.12
# Measured at quality 94: bytes grow roughly as texture_amplitude ** 0.6, and amplitude 14 gives
# about 3.2 bits per pixel.
SIZE_EXPONENT = 0.6
REFERENCE_AMPLITUDE, REFERENCE_BPP = 14.0, 3.2
AMPLITUDE_RANGE = (3.0, 40.0)
MAX_SIZE_FITS = 3

_KIND_JPEG, _KIND_GRAY, _KIND_PNG = "jpeg", "gray", "png"


@dataclass(frozen=True)
class _Task:
    out: str
    seed: int
    classes: int
    index: int
    kind: str
    class_dir: str
    name: str


def make_images(
    out: str | Path,
    count: int,
    classes: int,
    seed: int,
    progress: bool = True,
    *,
    workers: int | None = None,
    format: str = "folder",
    shard_size: int = DEFAULT_SHARD_SIZE,
) -> dict:
    """Write ``count`` images into ``out/class_XXX/img_XXXXXX.{jpg,png}`` (``format="folder"``) or into tar
    shards ``out/train-000000.tar``, ... of ``shard_size`` samples (``format="webdataset"``), and a marker file.

    ``out`` must be absent, empty, or a previous output of this function (it has the marker file),
    whose generated files are then replaced. Returns a summary: count, classes, seed, bytes,
    mean_kb, jpeg_kb (min/median/mean/max over colour JPEGs), min_side, max_side, grayscale, png,
    seconds, format, out; for shards also shards, shard_size and pattern (the brace pattern naming them all,
    to pass to ``image.train``).
    """
    positive_int("count", count)
    positive_int("classes", classes)
    if classes > count:
        raise ValueError(f"classes must be <= count ({count}), got {classes}")
    int_at_least("seed", seed, 0)
    if workers is None:
        workers = os.cpu_count() or 1
    positive_int("workers", workers)
    one_of("format", format, FORMATS)
    positive_int("shard_size", shard_size)
    if format == "webdataset":
        _shard_writer()  # fail before any work when webdataset is missing
    out = Path(out)
    _prepare_output(out)

    started = time.perf_counter()
    tasks = _tasks(out, count, classes, seed)
    if format == "folder":
        for class_dir in sorted({t.class_dir for t in tasks}):
            (out / class_dir).mkdir(parents=True, exist_ok=True)
        results = list(_generate(tasks, _write_image, workers, progress, ordered=False))
        extra = {}
    else:
        # An ImageFolder of the same images lists them class by class, then by name: the shards keep that order.
        tasks.sort(key=lambda t: (t.class_dir, t.name))
        results, extra = _write_shards(out, tasks, shard_size, _generate(tasks, _render_image, workers, progress,
                                                                            ordered=True))

    summary = _summarise(results, count, classes, seed, time.perf_counter() - started)
    summary.update({"format": format, "out": str(out), **extra})
    marker = {
        "version": MARKER_VERSION,
        "count": count,
        "classes": classes,
        "seed": seed,
        "bytes": summary["bytes"],
    }
    if format == "webdataset":
        marker.update({"format": format, "shards": extra["shards"], "shard_size": shard_size,
                       "pattern": extra["pattern"]})
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return summary


def _generate(tasks: list[_Task], work, workers: int, progress: bool, *, ordered: bool):
    """``work(task)`` for every task, on ``workers`` processes; in the tasks' order when ``ordered``."""
    with tqdm(total=len(tasks), desc="images", unit="img", disable=not progress) as bar:
        if workers == 1 or len(tasks) < 2 * workers:
            for task in tasks:
                yield work(task)
                bar.update()
        else:
            # spawn: the caller may hold threads (torch, DALI) that make fork unsafe.
            with multiprocessing.get_context("spawn").Pool(workers) as pool:
                imap = pool.imap if ordered else pool.imap_unordered
                for result in imap(work, tasks, chunksize=8):
                    yield result
                    bar.update()


def _shard_writer():
    try:
        from webdataset import ShardWriter
    except ImportError:
        raise ValueError("format='webdataset' writes shards with the webdataset package, which is not installed "
                         "(pip install webdataset)") from None
    return ShardWriter


def _write_shards(out: Path, tasks: list[_Task], shard_size: int, rendered) -> tuple[list[tuple], dict]:
    """Writes the rendered images, in the tasks' order, into shards of ``shard_size`` samples."""
    shard_writer = _shard_writer()
    pattern = str(out / f"{SHARD_PREFIX}-%0{SHARD_DIGITS}d.tar")
    results = []
    with shard_writer(pattern, maxcount=shard_size, maxsize=float("inf"), verbose=0, encoder=False,
                      mtime=SHARD_MTIME) as sink:
        for task, (result, data) in zip(tasks, rendered):
            key, ext = task.name.rsplit(".", 1)
            sink.write({"__key__": key, ext: data, "cls": str(task.index % task.classes).encode("ascii")})
            results.append(result)
    shards = -(-len(tasks) // shard_size)
    last = f"{shards - 1:0{SHARD_DIGITS}d}"
    braces = f"{{{0:0{SHARD_DIGITS}d}..{last}}}" if shards > 1 else last
    return results, {"shards": shards, "shard_size": shard_size,
                     "pattern": str(out / f"{SHARD_PREFIX}-{braces}.tar")}


def read_marker(out: str | Path) -> dict | None:
    """The marker written by a finished :func:`make_images` run in ``out``, or None."""
    path = Path(out) / MARKER
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def _prepare_output(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"out must be a directory, but {out} is a file")
    if not out.exists():
        out.mkdir(parents=True)
        return
    if not any(out.iterdir()):
        return
    if not (out / MARKER).is_file():
        raise ValueError(
            f"out directory {out} is not empty and has no {MARKER} marker; "
            "choose an empty or new directory"
        )
    # A previous run's output: drop the marker first so an interrupted rerun never looks finished.
    (out / MARKER).unlink()
    for class_dir in out.glob("class_*"):
        if not class_dir.is_dir():
            continue
        for item in class_dir.glob("img_*"):
            if item.suffix in (".jpg", ".png") and item.is_file():
                item.unlink()
        if not any(class_dir.iterdir()):
            class_dir.rmdir()
    for shard in out.glob(f"{SHARD_PREFIX}-*.tar"):
        for item in (shard, shard.with_name(f".{shard.name}.feedline-idx")):  # and the index a Loader left
            if item.is_file():
                item.unlink()


def _tasks(out: Path, count: int, classes: int, seed: int) -> list[_Task]:
    n_gray = _special_count(count, GRAYSCALE_FRACTION)
    n_png = _special_count(count, PNG_FRACTION)
    order = np.random.default_rng([seed, count, 0x5EC1A1]).permutation(count)
    kinds = [_KIND_JPEG] * count
    for i in order[:n_gray]:
        kinds[i] = _KIND_GRAY
    for i in order[n_gray : n_gray + n_png]:
        kinds[i] = _KIND_PNG
    class_width = max(3, len(str(classes - 1)))
    index_width = max(6, len(str(count - 1)))
    tasks = []
    for i in range(count):
        suffix = "png" if kinds[i] == _KIND_PNG else "jpg"
        tasks.append(
            _Task(
                out=str(out),
                seed=seed,
                classes=classes,
                index=i,
                kind=kinds[i],
                class_dir=f"class_{i % classes:0{class_width}d}",
                name=f"img_{i:0{index_width}d}.{suffix}",
            )
        )
    return tasks


def _special_count(count: int, fraction: float) -> int:
    if count < 50:
        return 0
    return max(1, round(count * fraction))


def _summarise(results: list[tuple], count: int, classes: int, seed: int, seconds: float) -> dict:
    sizes = np.array([r[1] for r in results], dtype=np.int64)
    sides = np.array([r[2:4] for r in results], dtype=np.int64)
    jpeg_kb = np.array([r[1] for r in results if r[0] == _KIND_JPEG], dtype=np.float64) / 1024
    kinds = [r[0] for r in results]
    return {
        "count": count,
        "classes": classes,
        "seed": seed,
        "bytes": int(sizes.sum()),
        "mean_kb": round(float(sizes.mean()) / 1024, 1),
        "jpeg_kb": _stats(jpeg_kb),
        "min_side": int(sides.min()),
        "max_side": int(sides.max()),
        "grayscale": kinds.count(_KIND_GRAY),
        "png": kinds.count(_KIND_PNG),
        "seconds": round(seconds, 2),
    }


def _stats(values: np.ndarray) -> dict:
    if values.size == 0:
        return {}
    return {
        "min": round(float(values.min()), 1),
        "median": round(float(np.median(values)), 1),
        "mean": round(float(values.mean()), 1),
        "max": round(float(values.max()), 1),
    }


def _write_image(task: _Task) -> tuple[str, int, int, int]:
    result, data = _render_image(task)
    (Path(task.out) / task.class_dir / task.name).write_bytes(data)
    return result


def _render_image(task: _Task) -> tuple[tuple[str, int, int, int], bytes]:
    """The encoded image of ``task`` and its summary row (kind, bytes, width, height)."""
    rng = np.random.default_rng([task.seed, task.index])
    height, width = _image_shape(rng)
    label = task.index % task.classes
    palette = _class_palette(task.seed, label, task.classes)
    base, texture = _compose(rng, height, width, palette)
    target_bytes = _target_kb(rng, height, width) * 1024
    bpp = target_bytes * 8 / (height * width)
    amplitude = REFERENCE_AMPLITUDE * (bpp / REFERENCE_BPP) ** (1.0 / SIZE_EXPONENT)
    amplitude = float(np.clip(amplitude, *AMPLITUDE_RANGE))

    if task.kind == _KIND_PNG:
        data = _encode(_render(base, texture, amplitude), "PNG")
    else:
        mode = "L" if task.kind == _KIND_GRAY else "RGB"
        data = _fit_jpeg(base, texture, amplitude, mode, target_bytes)
    return (task.kind, len(data), width, height), data


def _image_shape(rng: np.random.Generator) -> tuple[int, int]:
    long_side = int(rng.integers(400, MAX_SIDE + 1))
    aspect = float(rng.choice([0.75, 0.667, 0.8, 1.0, 0.5625, float(rng.uniform(0.5, 1.0))]))
    short_side = int(np.clip(round(long_side * aspect), MIN_SIDE, MAX_SIDE))
    landscape = rng.random() < 0.75
    return (short_side, long_side) if landscape else (long_side, short_side)


def _target_kb(rng: np.random.Generator, height: int, width: int) -> float:
    # Larger images get larger files, as photos do, so that bits per pixel stay plausible.
    low, high = TARGET_KB
    small, large = MIN_SIDE * 500, 640 * 640
    position = (height * width - small) / (large - small) + rng.normal(0.0, 0.2)
    position = float(np.clip(position, 0.0, 1.0))
    return float(np.exp(np.log(low) + position * (np.log(high) - np.log(low))))


def _class_palette(seed: int, label: int, classes: int) -> np.ndarray:
    """Five RGB colours (float32, 0-255) around a hue that is the class's own."""
    rng = np.random.default_rng([seed, 0xC0105, label])
    hue = (label + rng.uniform(-0.2, 0.2)) / classes
    colours = []
    for _ in range(5):
        h = (hue + rng.normal(0.0, 0.06)) % 1.0
        s = rng.uniform(0.25, 0.85)
        v = rng.uniform(0.25, 0.95)
        colours.append(colorsys.hsv_to_rgb(h, s, v))
    return (np.array(colours, dtype=np.float32) * 255.0).astype(np.float32)


def _pink_noise(rng: np.random.Generator, height: int, width: int, alpha: float) -> np.ndarray:
    """Zero-mean, unit-variance field whose amplitude spectrum falls as 1/f**alpha."""
    fy = np.fft.fftfreq(height).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(width).astype(np.float32)[None, :]
    freq = np.sqrt(fy * fy + fx * fx)
    freq[0, 0] = 1.0
    amplitude = freq ** np.float32(-alpha)
    amplitude[0, 0] = 0.0
    shape = (height, width // 2 + 1)
    spectrum = rng.standard_normal(shape, dtype=np.float32) + 1j * rng.standard_normal(
        shape, dtype=np.float32
    )
    field = np.fft.irfft2(spectrum * amplitude, s=(height, width)).astype(np.float32)
    field -= field.mean()
    field /= field.std() + np.float32(1e-8)
    return field


def _smooth_field(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A smooth (1/f**2) field, generated at quarter size and upsampled."""
    small = _pink_noise(rng, max(8, height // 4), max(8, width // 4), 2.0)
    image = Image.fromarray(small).resize((width, height), Image.Resampling.BILINEAR)
    return np.asarray(image, dtype=np.float32)


def _compose(
    rng: np.random.Generator, height: int, width: int, palette: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The image without texture and its unit texture, both float32 (3, H, W)."""
    ys = np.arange(height, dtype=np.float32)[:, None] / np.float32(height)
    xs = np.arange(width, dtype=np.float32)[None, :] / np.float32(width)
    angle = rng.uniform(0.0, 2.0 * np.pi)
    ramp = np.float32(np.cos(angle)) * xs + np.float32(np.sin(angle)) * ys
    ramp = (ramp - ramp.min()) / (ramp.max() - ramp.min() + np.float32(1e-6))
    ramp = ramp * ramp * (np.float32(3.0) - np.float32(2.0) * ramp)
    first, second = palette[rng.choice(len(palette), size=2, replace=False)]
    blotch_gain = np.float32(rng.uniform(8.0, 20.0))
    image = np.empty((3, height, width), dtype=np.float32)
    for c in range(3):
        blotches = _smooth_field(rng, height, width)
        image[c] = first[c] + (second[c] - first[c]) * ramp + blotches * blotch_gain
    # Shapes are shaded by the last blotch field, so they look lit rather than flat.
    shading = np.float32(1.0) + np.float32(0.12) * blotches
    for _ in range(int(rng.integers(2, 7))):
        mask, (top, left) = _shape_mask(rng, height, width)
        rows, cols = slice(top, top + mask.shape[0]), slice(left, left + mask.shape[1])
        colour = palette[rng.integers(len(palette))] + rng.normal(0.0, 12.0, 3).astype(np.float32)
        for c in range(3):
            region = image[c, rows, cols]
            region += (colour[c] * shading[rows, cols] - region) * mask

    luminance = _pink_noise(rng, height, width, float(rng.uniform(0.9, 1.2)))
    luminance += rng.standard_normal((height, width), dtype=np.float32) * np.float32(0.15)
    chroma = _smooth_field(rng, height, width) * np.float32(0.25)
    texture = np.empty_like(image)
    for c, weight in enumerate((1.0, -0.5, -0.5)):
        texture[c] = luminance + np.float32(weight) * chroma
    return image, texture


def _shape_mask(
    rng: np.random.Generator, height: int, width: int
) -> tuple[np.ndarray, tuple[int, int]]:
    """A soft-edged ellipse or polygon: float32 coverage in [0, 1] and its (top, left) corner."""
    cx, cy = rng.uniform(0.1, 0.9) * width, rng.uniform(0.1, 0.9) * height
    radius = rng.uniform(0.08, 0.35) * min(width, height)
    ellipse = rng.random() < 0.5
    if ellipse:
        rx, ry = radius, radius * rng.uniform(0.4, 1.0)
    else:
        sides = int(rng.integers(3, 8))
        angles = np.sort(rng.uniform(0.0, 2.0 * np.pi, sides))
        radii = radius * rng.uniform(0.6, 1.0, sides)
    blur = float(rng.uniform(0.8, 3.0))

    margin = int(np.ceil(3 * blur)) + 1
    top, left = max(0, int(cy - radius) - margin), max(0, int(cx - radius) - margin)
    bottom = min(height, int(np.ceil(cy + radius)) + margin)
    right = min(width, int(np.ceil(cx + radius)) + margin)
    mask = Image.new("L", (right - left, bottom - top), 0)
    draw = ImageDraw.Draw(mask)
    cx, cy = cx - left, cy - top
    if ellipse:
        draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=255)
    else:
        points = [
            (float(cx + r * np.cos(a)), float(cy + r * np.sin(a))) for a, r in zip(angles, radii)
        ]
        draw.polygon(points, fill=255)
    mask = mask.filter(ImageFilter.GaussianBlur(blur))
    return np.asarray(mask, dtype=np.float32) / np.float32(255.0), (top, left)


def _render(base: np.ndarray, texture: np.ndarray, amplitude: float) -> Image.Image:
    pixels = base + texture * np.float32(amplitude)
    pixels += np.float32(0.5)
    channels = np.clip(pixels, 0, 255).astype(np.uint8)
    return Image.merge("RGB", [Image.fromarray(channel) for channel in channels])


def _encode(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    if fmt == "PNG":
        image.save(buffer, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    else:
        image.save(buffer, format="JPEG", quality=JPEG_QUALITY, subsampling="4:2:0")
    return buffer.getvalue()


def _fit_jpeg(
    base: np.ndarray, texture: np.ndarray, amplitude: float, mode: str, target_bytes: float
) -> bytes:
    """Encode, then rescale the texture until the JPEG is within SIZE_TOLERANCE of the target."""
    data = _encode(_render(base, texture, amplitude).convert(mode), "JPEG")
    for _ in range(MAX_SIZE_FITS - 1):
        ratio = target_bytes / len(data)
        if abs(ratio - 1.0) <= SIZE_TOLERANCE:
            break
        amplitude = float(np.clip(amplitude * ratio ** (1.0 / SIZE_EXPONENT), *AMPLITUDE_RANGE))
        data = _encode(_render(base, texture, amplitude).convert(mode), "JPEG")
    return data
