"""``valid`` is in every batch, whatever the batch holds: a bool tensor beside ``index`` (same length, same
device), False exactly for padding and skipped slots, so that masking the loss with it (as the README says)
works from the first batch on, for images and tables, with and without padding or skipped samples."""
from pathlib import Path

import pytest
import torch

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import Loader
from feedline.pipelines import image
from feedline.pipelines.criteo import criteo

from conftest import write_images


def check_every_batch(loader) -> list[int]:
    """The valid samples' indices over one epoch, after checking every batch's ``valid``."""
    delivered = []
    for batch in loader:
        valid = batch["valid"]
        assert valid.dtype == torch.bool and valid.shape == batch["index"].shape
        assert valid.device == batch["index"].device
        delivered += batch["index"][valid].tolist()
    return delivered


def masked_loss(batch) -> torch.Tensor:
    """The README's recipe: a per-sample loss masked with ``valid``."""
    per_sample = batch["index"].to(torch.float32) ** 2
    return (per_sample * batch["valid"]).sum() / batch["valid"].sum()


@pytest.fixture(scope="module")
def images_with_a_bad_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_images")
    paths = write_images(root, 11, classes=2, seed=4)
    paths[5].write_bytes(b"not an image")
    listed = sorted(str(p) for p in root.rglob("*.jpg"))
    return root, listed.index(str(paths[5]))


@pytest.mark.parametrize("last_batch", ["partial", "pad", "drop"])
def test_images_without_bad_files(image_dir, last_batch):
    loader = Loader(image.train(image_dir, size=32), batch_size=8, placement="cpu", last_batch=last_batch)
    first = next(iter(loader))
    assert masked_loss(first) > 0
    seen = check_every_batch(loader)
    assert len(seen) == len(set(seen)) == (32 if last_batch == "drop" else 37)


@pytest.mark.parametrize("last_batch", ["partial", "pad"])
def test_images_with_a_skipped_file(images_with_a_bad_file, last_batch):
    root, bad = images_with_a_bad_file
    loader = Loader(image.val(root, size=32), batch_size=4, placement="cpu", on_error="skip", last_batch=last_batch)
    first = next(iter(loader))
    assert torch.isfinite(masked_loss(first))
    assert sorted(check_every_batch(loader)) == [i for i in range(11) if i != bad]


@pytest.fixture(scope="module")
def criteo_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("criteo")
    make_criteo(folder / "good.tsv", 300, seed=2)
    lines = (folder / "good.tsv").read_text().splitlines()
    lines[40] = "x" * 10  # a bad row among good ones
    (folder / "day.tsv").write_text("\n".join(lines) + "\n")
    return folder


@pytest.mark.parametrize("name,on_error,last_batch", [("good.tsv", "raise", "partial"), ("good.tsv", "raise", "pad"),
                                                      ("day.tsv", "skip", "partial"), ("day.tsv", "skip", "pad")])
def test_tables(criteo_file, name, on_error, last_batch):
    spec = criteo(criteo_file / name, table_sizes=1000, on_error=on_error)
    loader = Loader(spec, batch_size=64, placement="cpu", last_batch=last_batch, num_threads=1)
    first = next(iter(loader))
    assert torch.isfinite(masked_loss(first))
    seen = check_every_batch(loader)
    assert len(seen) == len(set(seen)) == 300 - (name == "day.tsv")


def criteo_300(data):
    path = Path(data).parent / "valid-mask-criteo.tsv"
    if not path.exists():
        make_criteo(path, 300, seed=2)
    return criteo(path, table_sizes=1000)


@pytest.mark.gpu(pipeline=criteo_300, placements=["gpu"])
def test_a_table_on_the_gpu(image_dir):
    loader = Loader(criteo_300(image_dir), batch_size=64, placement="gpu", device="cuda")
    assert loader.device.type == "cuda"
    assert sorted(check_every_batch(loader)) == list(range(300))
