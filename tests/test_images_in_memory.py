"""Images named in memory: ``(paths, labels)``, ``(path, label)`` pairs, or paths alone (no labels: batches hold no
``label`` key, in every batch), told apart from webdataset shards by what the paths are, never by writing
anything beside them."""
from __future__ import annotations

import os
import pickle
import tarfile

import numpy as np
import pytest
import torch

from feedline.loader import DataError, Loader
from feedline.pipelines import image
from feedline.pipelines.image_sources import ImageList, WebDataset, image_source

from conftest import write_images
from corrupt_images import payload


@pytest.fixture
def photos(tmp_path):
    paths = write_images(tmp_path / "photos", 10, classes=2, seed=11, sizes=[(60 + k, 44 + k) for k in range(10)])
    return sorted(str(p) for p in paths)


def _listing(folder) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)


def test_paths_alone_are_images_without_labels_and_nothing_is_written(photos, tmp_path):
    before = _listing(tmp_path)
    spec = image.val(photos, size=32, output="uint8")
    assert isinstance(spec.source, ImageList) and spec.source.labels is None
    loader = Loader(spec, batch_size=4, placement="cpu", last_batch="pad")
    batches = list(loader)
    assert [sorted(b) for b in batches] == [["image", "index", "valid"]] * 3  # the padded last batch too
    assert [i for b in batches for i in b["index"][b["valid"]].tolist()] == list(range(10))
    assert _listing(tmp_path) == before


def test_paths_and_labels_deliver_the_folders_samples(photos, tmp_path):
    """The same files as a list with the folder's labels: the same images and labels as the folder."""
    folder = Loader(image.val(tmp_path / "photos", size=32), batch_size=4, placement="cpu", shuffle=False)
    labels = folder.source.labels.tolist()
    for data in ((list(folder.source.paths), labels), list(zip(folder.source.paths, labels)),
                 (tuple(folder.source.paths), np.asarray(labels))):
        listed = Loader(image.val(data, size=32), batch_size=4, placement="cpu", shuffle=False)
        assert isinstance(listed.pipeline.source, ImageList)
        for a, b in zip(folder, listed, strict=True):
            assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])


def test_unlabelled_images_train_and_skip_with_the_same_keys(photos, tmp_path):
    bad = tmp_path / "photos" / "broken.jpg"
    bad.write_bytes(payload("text", seed=1))
    paths = photos[:5] + [str(bad)] + photos[5:]
    loader = Loader(image.train(paths, size=24, output="uint8"), batch_size=4, placement="cpu", on_error="skip",
                    seed=3)
    seen = []
    for batch in loader:
        assert sorted(batch) == ["image", "index", "valid"]
        seen += batch["index"][batch["valid"]].tolist()
    assert sorted(seen) == [i for i in range(11) if i != 5]
    assert [s.where for s in loader.skipped] == [str(bad)]
    with pytest.raises(DataError, match="not an image") as info:
        list(Loader(image.train(paths, size=24), batch_size=4, placement="cpu", shuffle=False))
    assert info.value.where == str(bad)


def test_shards_and_images_are_told_apart_by_what_they_are(photos, tmp_path):
    shard = tmp_path / "s0.tar"
    with tarfile.open(shard, "w") as tf:
        tf.add(photos[0], "k0.jpg")
        (tmp_path / "k0.cls").write_text("1")
        tf.add(tmp_path / "k0.cls", "k0.cls")
    plain = tmp_path / "plain"
    plain.mkdir()
    no_ext_image, no_ext_shard = plain / "0001", plain / "0002"
    no_ext_image.write_bytes(open(photos[0], "rb").read())
    no_ext_shard.write_bytes(shard.read_bytes())
    assert isinstance(image_source([str(shard)]), WebDataset)
    assert isinstance(image_source([str(no_ext_shard)]), WebDataset)
    assert isinstance(image_source([str(no_ext_image), photos[1]]), ImageList)
    assert isinstance(image_source([photos[0]]), ImageList)
    with pytest.raises(ValueError, match="mixes webdataset shards") as info:
        image_source([photos[0], str(shard)])
    assert photos[0] in str(info.value) and str(shard) in str(info.value)
    batch = next(iter(Loader(image.val([str(no_ext_image)], size=16), batch_size=1, placement="cpu")))
    assert "label" not in batch and batch["image"].shape == (1, 3, 16, 16)


@pytest.mark.parametrize("data, error, match", [
    (([], []), ValueError, "list is empty"),
    ((["a.jpg", "b.jpg"], [0]), ValueError, "2 paths but 1 labels"),
    ((["a.jpg", "b.jpg"], [0, -1]), ValueError, r"labels\[1\] must be a non-negative"),
    ((["a.jpg", "b.jpg"], [0, 1.5]), TypeError, r"labels\[1\] must be an integer"),
    ((["a.jpg", "b.jpg"], [0, True]), TypeError, r"labels\[1\] must be an integer"),
    ((["a.jpg", 3], [0, 1]), TypeError, r"paths\[1\]"),
    ((["a.jpg", ""], [0, 1]), TypeError, r"paths\[1\]"),
    ("labels", TypeError, None),
])
def test_bad_lists_are_refused_when_declared(data, error, match):
    if data == "labels":
        with pytest.raises(TypeError, match="labels must be"):
            ImageList(("a.jpg",), "0")
        return
    with pytest.raises(error, match=match):
        image.val(data)


def test_a_list_declaration_pickles_and_missing_files_are_named_when_read(tmp_path, photos):
    gone = str(tmp_path / "gone.jpg")
    spec = image.val((photos[:3] + [gone], [0, 1, 0, 1]), size=16)
    again = pickle.loads(pickle.dumps(spec))
    assert again.source == spec.source
    loader = Loader(again, batch_size=4, placement="cpu", on_error="skip")
    assert sorted(i for b in loader for i in b["index"][b["valid"]].tolist()) == [0, 1, 2]
    assert [s.where for s in loader.skipped] == [gone] and "not found" in loader.skipped[0].reason
