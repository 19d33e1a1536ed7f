"""Every row exactly once per epoch: with and without shuffling, over several files, and over 1..4 shards;
and through the Loader."""
import numpy as np
import pytest

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import Loader
from runners import feature_runner
from feedline.loader.sampler import EpochSampler
from feedline.pipelines.criteo import criteo

ROWS = 1234


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    root = tmp_path_factory.mktemp("criteo_coverage")
    make_criteo(root / "a.tsv", 1000, seed=1)
    make_criteo(root / "b.tsv.gz", ROWS - 1000, seed=2)
    return criteo([root / "a.tsv", root / "b.tsv.gz"], table_sizes=1000)


@pytest.fixture(scope="module")
def runner(spec):
    return feature_runner(spec, prefetch=3, num_threads=2)


def rows_of(batch):
    """A fingerprint of each row's content, to tell that index i really carries row i."""
    dense = batch["dense"].numpy()
    ids = batch["sparse"]["values"].numpy().reshape(26, -1).T
    return [hash((d.tobytes(), i.tobytes())) for d, i in zip(dense, ids)]


@pytest.fixture(scope="module")
def fingerprints(runner):
    ((batch, _),) = runner.batches(iter(EpochSampler(ROWS, ROWS, shuffle=False).epoch(0)))
    return rows_of(batch)


@pytest.mark.parametrize("shuffle", [False, True])
def test_one_epoch_yields_every_row_once(runner, fingerprints, shuffle):
    sampler = EpochSampler(runner.num_samples, 100, shuffle=shuffle, seed=7)
    seen = []
    for batch, _ in runner.batches(iter(sampler.epoch(0))):
        seen += batch["index"].tolist()
        assert rows_of(batch) == [fingerprints[i] for i in batch["index"].tolist()]
    assert sorted(seen) == list(range(ROWS))
    assert (seen != sorted(seen)) == shuffle


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("last_batch", ["partial", "pad"])
def test_shards_cover_every_row_once(runner, world_size, last_batch):
    delivered = []
    for rank in range(world_size):
        sampler = EpochSampler(ROWS, 64, shuffle=True, seed=3, rank=rank, world_size=world_size,
                               last_batch=last_batch)
        for batch, _ in runner.batches(iter(sampler.epoch(2))):
            valid = batch["valid"].numpy() if "valid" in batch else np.ones(len(batch["index"]), bool)
            delivered += batch["index"].numpy()[valid].tolist()
    assert sorted(delivered) == list(range(ROWS))


def test_stopping_early_leaves_no_thread_behind(runner):
    import threading

    before = set(threading.enumerate())  # other tests' dropped streams may still be winding down
    stream = runner.batches(iter(EpochSampler(ROWS, 10, shuffle=True).epoch(0)))
    next(stream)
    stream.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("feedline-features") and t not in before]


def test_loader_runs_the_criteo_pipeline(spec, fingerprints):
    loader = Loader(spec, batch_size=300, placement="cpu", shuffle=True, seed=0)
    assert loader.placement == {"parse": "cpu", "dense": "cpu", "hash": "cpu", "assemble": "cpu"}
    seen = []
    for batch in loader:
        seen += batch["index"].tolist()
        assert rows_of(batch) == [fingerprints[i] for i in batch["index"].tolist()]
    assert sorted(seen) == list(range(ROWS))
    loader.close()
