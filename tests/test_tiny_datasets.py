"""A dataset smaller than one batch (down to one sample) works under every placement: profiling for
``placement="auto"`` goes through it as many times as it needs, and every epoch delivers it whole."""
import warnings

import pytest

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import Loader
from feedline.pipelines import image
from feedline.pipelines.criteo import criteo

from conftest import write_images


def epochs(loader, n=2):
    """The valid samples of ``n`` epochs (``valid`` is tested in test_valid_mask.py)."""
    return [sorted(i for b in loader for i in b["index"][b.get("valid", b["index"] >= 0)].tolist())
            for _ in range(n)]


@pytest.mark.parametrize("count,batch_size", [(6, 8), (1, 8), (1, 1), (3, 2)])
@pytest.mark.parametrize("placement", ["auto", "cpu"])
def test_images_fewer_than_a_batch(tmp_path, count, batch_size, placement):
    write_images(tmp_path, count, classes=min(count, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # NumPy's "Mean of empty slice" came before the crash
        loader = Loader(image.train(tmp_path, size=32), batch_size=batch_size, placement=placement)
        assert epochs(loader) == [list(range(count))] * 2
        assert len(loader) == -(-count // batch_size)
        loader.close()


@pytest.mark.parametrize("placement", ["auto", "cpu"])
@pytest.mark.parametrize("last_batch", ["partial", "pad"])
def test_a_table_fewer_than_a_batch(tmp_path, placement, last_batch):
    make_criteo(tmp_path / "small.tsv", 100, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        loader = Loader(criteo(tmp_path / "small.tsv"), batch_size=8192, placement=placement, last_batch=last_batch)
        assert epochs(loader) == [list(range(100))] * 2
        assert [len(b["index"]) for b in loader] == [100 if last_batch == "partial" else 8192]
        loader.close()


def train32(data):
    return image.train(data, size=32)


@pytest.mark.gpu(pipeline=train32)
@pytest.mark.parametrize("placement", ["gpu", "auto"])
def test_images_fewer_than_a_batch_on_the_gpu(tmp_path, placement):
    write_images(tmp_path, 3, classes=2)
    loader = Loader(train32(tmp_path), batch_size=8, placement=placement, device="cuda")
    assert epochs(loader) == [[0, 1, 2]] * 2
    loader.close()
