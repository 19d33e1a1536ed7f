"""Reference figures that feedline's image pipelines are judged against.

* torchvision loaders: the standard ImageNet recipe in a ``DataLoader`` (float32 normalised, and a
  uint8 variant comparable with feedline's uint8 output).
* :func:`decode_bound`: how fast this machine can merely decode the files (PIL on every core, or
  DALI's CPU decoder), an upper bound for any CPU pipeline that decodes every image.

torch, torchvision and DALI are imported inside the functions that need them, so the PIL worker
processes that :func:`decode_bound` spawns stay light.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import time
from pathlib import Path

from PIL import Image

from ..loader.epochs import measure_loader  # noqa: F401  (the benchmarks' timer)
from ..pipelines.validate import int_at_least, positive_int, positive_seconds

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
# Batches each DataLoader worker makes ahead (torch's default, stated so that benchmarks can size their rounds
# past the read-ahead: workers * PREFETCH_FACTOR batches).
PREFETCH_FACTOR = 2


def train_transform(size: int = 224, *, normalize: bool = True):
    """RandomResizedCrop + flip; float32 normalised CHW, or uint8 CHW if ``normalize`` is False."""
    from torchvision.transforms import v2

    positive_int("size", size)
    steps = [v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()]
    return v2.Compose(steps + _to_tensor_steps(normalize))


def val_transform(size: int = 224, *, normalize: bool = True):
    """Shorter side to 256/224 of ``size``, centre crop; output as in :func:`train_transform`."""
    from torchvision.transforms import v2

    positive_int("size", size)
    steps = [v2.Resize(round(256 * size / 224), antialias=True), v2.CenterCrop(size)]
    return v2.Compose(steps + _to_tensor_steps(normalize))


def _to_tensor_steps(normalize: bool) -> list:
    import torch
    from torchvision.transforms import v2

    steps = [v2.PILToTensor()]
    if normalize:
        steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    return steps


def torchvision_train_loader(root: str | Path, batch_size: int, workers: int, size: int = 224):
    """Shuffled ImageFolder loader yielding (float32 [B,3,size,size] normalised, int64 [B])."""
    return _image_folder_loader(root, train_transform(size), batch_size, workers, shuffle=True)


def torchvision_val_loader(root: str | Path, batch_size: int, workers: int, size: int = 224):
    """In-order ImageFolder loader yielding (float32 [B,3,size,size] normalised, int64 [B])."""
    return _image_folder_loader(root, val_transform(size), batch_size, workers, shuffle=False)


def torchvision_train_loader_uint8(
    root: str | Path, batch_size: int, workers: int, size: int = 224
):
    """As :func:`torchvision_train_loader`, but images stay uint8 [B,3,size,size], unnormalised."""
    transform = train_transform(size, normalize=False)
    return _image_folder_loader(root, transform, batch_size, workers, shuffle=True)


def torchvision_val_loader_uint8(root: str | Path, batch_size: int, workers: int, size: int = 224):
    """As :func:`torchvision_val_loader`, but images stay uint8 [B,3,size,size], unnormalised."""
    transform = val_transform(size, normalize=False)
    return _image_folder_loader(root, transform, batch_size, workers, shuffle=False)


def _image_folder_loader(root, transform, batch_size: int, workers: int, *, shuffle: bool):
    import torch
    from torchvision.datasets import ImageFolder

    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"root must be an ImageFolder directory, got {str(root)!r}")
    positive_int("batch_size", batch_size)
    int_at_least("workers", workers, 0)
    return torch.utils.data.DataLoader(
        ImageFolder(str(root), transform=transform),
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=workers,
        prefetch_factor=PREFETCH_FACTOR if workers > 0 else None,
        persistent_workers=workers > 0,
        pin_memory=torch.cuda.is_available(),
    )


def decode_bound(
    files: list[str],
    seconds_budget: float = 20.0,
    workers: int | None = os.cpu_count(),
    *,
    dali_batch_size: int = 64,
) -> dict:
    """Decode throughput of ``files`` with PIL on ``workers`` processes and with DALI's CPU decoder.

    Each method decodes every file once after a short warm-up, stopping early if it spends half of
    ``seconds_budget``; the faster one is the bound.
    """
    files = [str(f) for f in files]
    if not files:
        raise ValueError("files must name at least one image, got an empty list")
    positive_seconds("seconds_budget", seconds_budget)
    workers = workers or 1
    positive_int("workers", workers)
    positive_int("dali_batch_size", dali_batch_size)
    pil = _pil_decode_rate(files, workers, seconds_budget / 2)
    dali = _dali_decode_rate(files, workers, dali_batch_size, seconds_budget / 2)
    return {
        "pil_samples_per_s": pil,
        "dali_samples_per_s": dali,
        "bound_samples_per_s": max(pil, dali),
        "bound_source": "pil" if pil >= dali else "dali",
        "files": len(files),
        "workers": workers,
    }


def _pil_decode(path: str) -> int:
    with Image.open(path) as image:
        rgb = image.convert("RGB")
        rgb.load()
    return 1


def _pil_decode_rate(files: list[str], workers: int, seconds: float) -> float:
    warmup = files[: min(len(files), 4 * workers)]
    chunk = max(1, min(16, len(files) // (8 * workers)))
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(_pil_decode, warmup)
        decoded = 0
        started = time.perf_counter()
        for done in pool.imap_unordered(_pil_decode, files, chunksize=chunk):
            decoded += done
            if time.perf_counter() - started > seconds:
                break
        elapsed = time.perf_counter() - started
        pool.terminate()
    return decoded / elapsed


def _dali_decode_rate(files: list[str], threads: int, batch_size: int, seconds: float) -> float:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=None, seed=0)
    def decode_only():
        encoded, _ = fn.readers.file(files=files, name="reader")
        return fn.decoders.image(encoded, device="cpu", output_type=types.RGB)

    pipe = decode_only()
    pipe.build()
    for _ in range(3):
        pipe.run()
    iterations = math.ceil(len(files) / batch_size)
    decoded = 0
    started = time.perf_counter()
    for _ in range(iterations):
        (images,) = pipe.run()
        decoded += len(images)
        if time.perf_counter() - started > seconds:
            break
    elapsed = time.perf_counter() - started
    del pipe
    return decoded / elapsed


def image_files(root: str | Path) -> list[str]:
    """Image files under an ImageFolder root, sorted."""
    root = Path(root)
    return sorted(
        str(p) for p in root.glob("*/*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="torchvision baselines and the decode bound")
    parser.add_argument("--data", required=True, help="ImageFolder root")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)

    report = {}
    for name, make in (
        ("torchvision_train_float32", torchvision_train_loader),
        ("torchvision_train_uint8", torchvision_train_loader_uint8),
    ):
        loader = make(args.data, args.batch_size, args.workers)
        report[name] = measure_loader(lambda l=loader: l, args.batches, args.warmup)
        del loader
    report["decode_bound"] = decode_bound(image_files(args.data), workers=args.workers)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
