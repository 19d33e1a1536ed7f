import os

import numpy as np
import pytest
from PIL import Image

from gpu_guard import pytest_runtest_setup  # noqa: F401  (skips a `gpu` test only where no GPU is)

from feedline.loader.sources import index_store


def _photo_like(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """Smooth gradients with soft blobs: structure that resizes like a photo, not noise."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.empty((height, width, 3), np.float32)
    for c in range(3):
        a, b, p = rng.uniform(-1, 1, 3)
        img[..., c] = 128 + 60 * np.sin(a * xx / 37 + b * yy / 53 + p * 6)
    for _ in range(4):
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(20, 120)
        blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))
        img += blob[..., None] * rng.uniform(-80, 80, 3)
    return np.clip(img, 0, 255).astype(np.uint8)


def write_images(root, count: int, classes: int = 2, seed: int = 0, sizes=None):
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        w, h = sizes[i] if sizes else (int(rng.integers(240, 520)), int(rng.integers(240, 520)))
        folder = root / f"class_{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"img_{i:04d}.jpg"
        Image.fromarray(_photo_like(rng, w, h)).save(path, quality=92)
        paths.append(path)
    return paths


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    write_images(root, 37, classes=3)
    return root


@pytest.fixture
def fresh_index_store(monkeypatch):
    """Indexes kept beside the data (no FEEDLINE_INDEX_DIR) and none remembered from another test, before and
    after this one."""
    monkeypatch.delenv(index_store.INDEX_DIR_ENV, raising=False)
    index_store.forget_memory()
    yield
    index_store.forget_memory()


_WARMED: set[tuple] = set()  # (reader, data suffix, placement, last_batch) warmed by a test of this session


@pytest.fixture
def kernels_warmed_once(monkeypatch):
    """For bench tests whose subject is not the kernel warm-up: benchmarks/kernel_warmup.py's warm-up (a spawned
    process over a sample of the data, 3-6 s even with numba's cache full) runs only for the readers no test of
    this session has warmed yet; once warmed their kernels are in numba's disk cache, and another warm-up would
    compile nothing (test_bench_warmup checks both)."""
    from feedline.benchmarks import kernel_warmup

    real = kernel_warmup.warm_kernels

    def warm_once(path, readers, **kw):
        where = (os.path.splitext(os.fspath(path))[1], kw.get("placement", "cpu"), kw.get("last_batch", "partial"))
        missing = tuple(r for r in readers if (r, *where) not in _WARMED)
        result = real(path, missing, **kw) if missing else {"kernel_compile_s": 0.0, "kernels_compiled": 0,
                                                             "kernel_warmup_s": 0.0}
        _WARMED.update((r, *where) for r in missing)
        return {**result, "kernel_warmup_readers": list(readers)}

    monkeypatch.setattr(kernel_warmup, "warm_kernels", warm_once)
