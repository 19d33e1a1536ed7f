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
