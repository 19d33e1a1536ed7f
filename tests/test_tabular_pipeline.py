"""A generic tabular pipeline (dense, bucketized, categorical, cross, multi-hot) checked row by row against an
independent computation, and what the runner promises about threads, errors and placement."""
import math
import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from sklearn.utils import murmurhash3_32

from feedline import ops
from feedline.loader.devices import gpu_available
from feedline.loader.errors import PlacementError
from feedline.loader.sources import open_source
from runners import batches, feature_runner
from feedline.loader.sampler import BatchPlan, EpochSampler
from feedline.pipelines.tabular import (Categorical, Column, ColumnKind, Cross, Dense, MultiHot, Schema,
                                        TabularFiles, tabular)

Y = [1, 0, 1, 0, 1, 1]
CLICKS = [3, None, -2, 0, 70000, 12]
AGE = [17.5, 18.0, None, 64.9, 65.0, 30.0]
CITY = ["ff", None, "10", "", "abc123", "7"]
SHOP = [5, 6, None, -1, 2**40, 5]
TAGS = [[1, 2, 3, 4, 5, 6], None, [], [7], [2**62, -5], [9, 9]]


def le8(v: int) -> bytes:
    return v.to_bytes(8, "little", signed=True)


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    path = tmp_path_factory.mktemp("tabular") / "rows.parquet"
    pq.write_table(pa.table({"y": Y, "clicks": CLICKS, "age": AGE, "city": CITY, "shop": SHOP,
                             "tags": pa.array(TAGS, type=pa.list_(pa.int64()))}), path)
    files = TabularFiles(path, "parquet", (
        Column("y", ColumnKind.INT), Column("clicks", ColumnKind.INT), Column("age", ColumnKind.FLOAT),
        Column("city", ColumnKind.HEX), Column("shop", ColumnKind.INT), Column("tags", ColumnKind.INT_LIST)))
    schema = Schema("y", (Dense("clicks"), Dense("age", clip_min=None, log1p=False, boundaries=(18, 30, 65)),
                          Categorical("city", 1000, seed=1), Cross("city", "shop", 500, seed=2),
                          MultiHot("tags", 100, seed=3, max_len=4)))
    return tabular(schema, files)


def expected(rows):
    city = [int(CITY[r], 16) if CITY[r] else -1 for r in rows]
    shop = [SHOP[r] if SHOP[r] is not None else -1 for r in rows]
    dense = np.array([[math.log1p(max(CLICKS[r] or 0, 0))] for r in rows], dtype=np.float32)
    age = [sum(np.float32(AGE[r] or 0.0) >= b for b in (18, 30, 65)) for r in rows]
    tags = [[murmurhash3_32(le8(t), 3, positive=True) % 100 for t in (TAGS[r] or [])[:4]] for r in rows]
    values = (age + [murmurhash3_32(le8(c), 1, positive=True) % 1000 for c in city]
              + [murmurhash3_32(le8(c) + le8(s), 2, positive=True) % 500 for c, s in zip(city, shop)]
              + [t for row in tags for t in row])
    lengths = [1] * (3 * len(rows)) + [len(t) for t in tags]
    return np.array([float(Y[r]) for r in rows], np.float32), dense, values, lengths


@pytest.mark.parametrize("rows", [[0, 1, 2, 3, 4, 5], [5, 3, 1], [4]])
def test_rows_match_an_independent_computation(spec, rows):
    runner = feature_runner(spec)
    (batch,) = batches(runner, [BatchPlan(np.array(rows), np.ones(len(rows), bool))])
    label, dense, values, lengths = expected(rows)
    np.testing.assert_array_equal(batch["label"].numpy(), label)
    assert np.abs(batch["dense"].numpy().view(np.int32) - dense.view(np.int32)).max() <= 1
    sparse = batch["sparse"]
    assert sparse["keys"] == ["age", "city", "city_x_shop", "tags"]  # the schema's order
    assert sparse["values"].tolist() == values
    assert sparse["lengths"].tolist() == lengths
    assert sparse["offsets"].tolist() == [0, *np.cumsum(lengths).tolist()]


def test_worker_errors_reach_the_consumer_with_context(spec, monkeypatch):
    before = {t for t in threading.enumerate() if t.name.startswith("feedline-features")}  # other tests' pools
    runner = feature_runner(spec, num_threads=2, prefetch=2)
    real = runner.source.gather

    def flaky(rows, **kwargs):  # the third batch's read fails, whichever thread reads it and when
        if 2 in np.asarray(rows).tolist():
            raise OSError("disk went away")
        return real(rows, **kwargs)

    monkeypatch.setattr(runner.source, "gather", flaky)
    plans = EpochSampler(6, 1, shuffle=False).epoch(0)
    stream = runner.batches(iter(plans))
    got = []
    with pytest.raises(OSError, match="disk went away") as info:
        for batch, _ in stream:
            got.append(batch)
    assert len(got) == 2
    assert any("feedline feature worker thread" in note for note in getattr(info.value, "__notes__", []))
    assert not [t for t in threading.enumerate() if t.name.startswith("feedline-features") and t not in before]


def test_arguments_are_checked(spec):
    with pytest.raises(ValueError, match="cut must be one of"):
        feature_runner(spec, 0)
    with pytest.raises(ValueError, match="prefetch"):
        feature_runner(spec, prefetch=0)
    with pytest.raises(ValueError, match="num_threads"):
        feature_runner(spec, num_threads=0)
    with pytest.raises(PlacementError, match="CUDA device"):
        feature_runner(spec, 1)


def test_cpu_placement_never_imports_cupy(tmp_path):
    script = f"""
import sys
import numpy as np
from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader.runners import RunnerConfig
from feedline.loader.runners.feature_runner import FeatureRunner
from feedline.loader.sampler import EpochSampler
from feedline.loader.sources import open_source
from feedline.pipelines.criteo import criteo
import torch
make_criteo({str(tmp_path / 'd.tsv')!r}, 100, seed=0)
spec = criteo({str(tmp_path / 'd.tsv')!r})
runner = FeatureRunner(spec, open_source(spec.source), RunnerConfig(spec.all_cpu, torch.device("cpu"), 32))
for batch in runner.batches(iter(EpochSampler(100, 32).epoch(0))):
    pass
assert "cupy" not in sys.modules, "cupy was imported"
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU")
def test_every_gpu_cut_gives_the_cpu_batches(spec, tmp_path):
    from feedline.datagen.synthetic_criteo import make_criteo
    from feedline.pipelines.criteo import criteo

    make_criteo(tmp_path / "d.tsv", 3000, seed=0)
    for pipeline in (spec, criteo(tmp_path / "d.tsv")):
        source = open_source(pipeline.source)
        plans = EpochSampler(len(source), 512, shuffle=True, last_batch="pad").epoch(0)
        cpu = batches(feature_runner(pipeline, source=source), plans)
        for cut in pipeline.valid_cuts():
            gpu = batches(feature_runner(pipeline, cut, "cuda", source=source), plans)
            for a, b in zip(cpu, gpu, strict=True):
                for key in a:
                    if key == "sparse":
                        for k in ("values", "lengths", "offsets"):
                            assert b[key][k].is_cuda and torch.equal(a[key][k], b[key][k].cpu()), (cut, k)
                    else:
                        assert b[key].is_cuda and torch.equal(a[key], b[key].cpu()), (cut, key)


def test_one_buffer_carries_a_batch_across(spec):
    """What crosses to the GPU is packed into one host buffer; unpacking views it back, here with NumPy and
    CPU torch standing in for CuPy and CUDA torch (the same slicing and dtype views)."""
    from feedline.loader.runners.transfer import cupy_view as _cupy_view
    from feedline.loader.runners.transfer import pack as _pack
    from feedline.loader.runners.transfer import torch_view as _torch_view
    from feedline.loader.runners.transfer import unpack as _unpack
    from feedline.loader.sources.table_rows import ListColumn

    data = {"label": np.arange(5, dtype=np.float32), "dense": np.ones((5, 3), np.float32),
            "ids": np.arange(10, dtype=np.int64).reshape(2, 5), "valid": np.array([1, 0, 1, 1, 0], bool),
            "lists": (ListColumn(np.array([0, 2, 2], np.int64), np.array([7, 8], np.int64)),),
            "jagged": ops.Jagged(np.array([1, 2, 3], np.int64), np.array([2, 1], np.int32), np.array([0, 2, 3], np.int64)),
            "empty": np.zeros((0, 4), np.int32)}
    buffer, layout = _pack(data)
    assert buffer.ndim == 1 and buffer.dtype == np.uint8
    outputs = {k: v for k, v in data.items() if k != "jagged"}  # outputs hold no Jagged: _plain made it a dict
    torch_buffer, torch_layout = _pack(outputs)
    for back in (_unpack(buffer, layout, _cupy_view), _unpack(torch.from_numpy(torch_buffer), torch_layout, _torch_view)):
        for key in ("label", "dense", "ids", "valid", "empty"):
            assert np.array_equal(np.asarray(back[key]), data[key]) and np.asarray(back[key]).dtype == data[key].dtype
        assert isinstance(back["lists"][0], ListColumn)
        assert np.array_equal(np.asarray(back["lists"][0].values), [7, 8])
    jagged = _unpack(buffer, layout, _cupy_view)["jagged"]
    assert isinstance(jagged, ops.Jagged) and jagged.lengths.tolist() == [2, 1]


def test_a_stage_keeps_the_shapes_of_a_few_batch_sizes():
    """``shapes_of``: ``shapes`` made once per batch size, for the first few sizes only (the runs of a table's
    chunks come in as many sizes as it has chunks)."""
    from feedline.pipelines.features import SHAPES_KEPT, Parse

    parse = Parse(("columns",), ("label", "dense_raw", "categorical_raw"), "label", ("a", "b"), ("c",), ())
    first = parse.shapes_of(8)
    assert parse.shapes_of(8) is first and first == parse.shapes(8)
    for rows in range(100):
        assert parse.shapes_of(rows) == parse.shapes(rows)
    assert len(parse._shapes_made) == SHAPES_KEPT
