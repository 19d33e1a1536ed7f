"""state_dict / load_state_dict for every kind of Loader (Criteo TSV and Parquet, a generic tabular schema,
images): mid-epoch, at an epoch's end, into the next epoch, for every last_batch policy and several ranks,
with skipped rows or files."""
import numpy as np
import pytest

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import Loader
from feedline.pipelines import image
from feedline.pipelines.criteo import criteo
from feedline.pipelines.tabular import Categorical, Column, ColumnKind, Dense, Schema, TabularFiles, tabular

from conftest import write_images
from save_restore import check_save_restore

ROWS = 203


@pytest.fixture(scope="module")
def criteo_with_bad_rows(tmp_path_factory):
    """203 good Criteo rows and three bad ones among them (lines 5, 77 and 150)."""
    folder = tmp_path_factory.mktemp("criteo")
    make_criteo(folder / "good.tsv", ROWS, seed=3)
    lines = (folder / "good.tsv").read_text().splitlines()
    for at, bad in ((4, "1\t2\tnot enough fields"), (76, "\t".join(["1"] * 14 + ["zz"] * 26)), (149, "x" * 10)):
        lines.insert(at, bad)
    path = folder / "day.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("policy", ["partial", "pad", "drop"])
def test_criteo_resumes_exactly_with_skipped_rows(criteo_with_bad_rows, policy, world_size):
    spec = criteo(criteo_with_bad_rows, table_sizes=1000, on_error="skip")
    seen = []
    for rank in range(world_size):
        def make():
            return Loader(spec, batch_size=16, placement="cpu", seed=7, last_batch=policy, rank=rank,
                          world_size=world_size, num_threads=1)
        reference = check_save_restore(make)
        loader = make()
        assert len(reference) == 2 * len(loader)
        seen += [s.where for s in (list(loader) and loader.skipped)]
    # Each bad row is met, and listed, on the rank whose rows hold it (drop leaves some rows out; with pad a
    # bad row can also be another rank's padding repeat, and is listed there too).
    expected = {f"{criteo_with_bad_rows}:{n}" for n in (5, 77, 150)}
    assert policy == "pad" or len(seen) == len(set(seen))
    assert set(seen) == expected if policy != "drop" else set(seen) <= expected


def test_parquet_and_a_generic_schema_resume_exactly(tmp_path):
    make_criteo(tmp_path / "d.parquet", 150, seed=1, format="parquet")
    check_save_restore(lambda: Loader(criteo(tmp_path / "d.parquet", table_sizes=100), batch_size=32,
                                      placement="cpu", seed=2, last_batch="pad"))
    rng = np.random.default_rng(0)
    (tmp_path / "t.tsv").write_text("".join(f"{rng.integers(0, 2)}\t{rng.integers(0, 99)}\t{rng.integers(0, 1 << 30):x}\n"
                                            for _ in range(90)))
    files = TabularFiles(tmp_path / "t.tsv", "tsv", (Column("y", ColumnKind.INT), Column("n", ColumnKind.INT),
                                                     Column("c", ColumnKind.HEX)))
    spec = tabular(Schema("y", (Dense("n"), Categorical("c", 50, seed=3))), files)
    check_save_restore(lambda: Loader(spec, batch_size=8, placement="cpu", seed=5, rank=1, world_size=2))


def test_a_resumed_loader_lists_the_same_skips(criteo_with_bad_rows):
    """The state carries what was skipped before it, so the resumed run lists every skip of the epoch."""
    spec = criteo(criteo_with_bad_rows, on_error="skip")
    whole = Loader(spec, batch_size=16, placement="cpu", shuffle=False)
    list(whole)
    first = Loader(spec, batch_size=16, placement="cpu", shuffle=False)
    it = iter(first)
    for _ in range(7):  # past line 77, before line 150 (which the loader may have read ahead already)
        next(it)
    assert [s.where.rsplit(":", 1)[1] for s in first.skipped][:2] == ["5", "77"]
    second = Loader(spec, batch_size=16, placement="cpu", shuffle=False)
    second.load_state_dict(first.state_dict())
    list(second)
    assert second.skipped == whole.skipped and len(second.skipped) == 3


@pytest.mark.parametrize("policy", ["partial", "pad", "drop"])
def test_images_resume_exactly_from_every_kind_of_stop(tmp_path, policy):
    write_images(tmp_path, 21, classes=2, seed=2)
    (tmp_path / "class_1" / "img_0007.jpg").write_bytes(b"not an image")  # skipped: its slot is filled
    spec = image.train(tmp_path, size=32, output="uint8")
    check_save_restore(lambda: Loader(spec, batch_size=4, placement="cpu", seed=3, last_batch=policy,
                                      on_error="skip", rank=0, world_size=2))


def test_a_resume_says_what_differs(tmp_path):
    """(A changed world_size resumes: tests/test_elastic_resume.py.)"""
    write_images(tmp_path, 12, classes=2)
    spec = image.train(tmp_path, size=32, output="uint8")
    saved_by = Loader(spec, batch_size=2, placement="cpu", seed=1, rank=1, world_size=4)
    next(iter(saved_by))
    state = saved_by.state_dict()
    with pytest.raises(ValueError, match="saved by rank 1 and this Loader is rank 0; each rank must load the state "
                                         "that its own rank saved"):
        Loader(spec, batch_size=2, placement="cpu", seed=1, rank=0, world_size=4).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size: 2 vs 3"):
        Loader(spec, batch_size=3, placement="cpu", seed=1, rank=1, world_size=4).load_state_dict(state)
