"""How the feature runner makes a batch: with the native kernels it equals the NumPy-only path bit for bit; the
buffers a batch is delivered in are reused only once the trainer lets go of them; for a GPU placement one
buffer carries exactly what crosses (the raw columns when everything after parsing runs on the GPU), and the
GPU stages, run on the emulated GPU, give the CPU's batches under every cut; sparse keys follow the schema."""
from __future__ import annotations

import math
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from sklearn.utils import murmurhash3_32

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import Loader
from feedline.loader.runners import transfer
from feedline.loader.sampler import BatchPlan, EpochSampler
from feedline.loader.sources import open_source
from feedline.loader.sources.text_to_columnar import convert
from feedline.ops import _native
from feedline.pipelines.criteo import criteo
from feedline.pipelines.tabular import (Categorical, Column, ColumnKind, Cross, Dense, MultiHot, Schema,
                                        TabularFiles, tabular)

from emulated_gpu import CXX, FakeDeviceArray, dev, gpu, kernels  # noqa: F401  (fixtures)
from runners import batches, feature_runner
from save_restore import flatten


@pytest.fixture(scope="module")
def criteo_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("batches")
    make_criteo(root / "day.tsv", 30_000, seed=4)
    convert(criteo(root / "day.tsv").source, root / "conv")
    return root


def epochs(spec, n=2, **kw):
    loader = Loader(spec, batch_size=4096, placement="cpu", device="cpu", seed=3, shuffle_buffer=10_000, **kw)
    out = [flatten(b) for _ in range(n) for b in loader]
    loader.close()
    return out


@pytest.mark.parametrize("which", ["day.tsv", "conv"])
def test_native_kernels_give_the_numpy_batches(criteo_files, which, monkeypatch):
    spec = criteo(criteo_files / which, table_sizes=1_000_003)
    _native.kernels.cache_clear()
    native = epochs(spec)
    monkeypatch.setenv(_native.ENV, "0")
    _native.kernels.cache_clear()
    try:
        reference = epochs(spec)
    finally:
        monkeypatch.delenv(_native.ENV)
        _native.kernels.cache_clear()
    assert len(native) == len(reference) == 2 * math.ceil(30_000 / 4096)
    for a, b in zip(native, reference):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == b[key] if key == "sparse.keys" else torch.equal(a[key], b[key]), key


def test_delivered_buffers_are_reused_only_after_the_trainer_lets_go(criteo_files):
    spec = criteo(criteo_files / "conv", table_sizes=1000)
    runner = feature_runner(spec, num_threads=2, prefetch=2)
    plans = list(EpochSampler(runner.num_samples, 1000, shuffle=True, seed=1).epoch(0))
    kept = batches(runner, plans)  # a trainer that keeps every batch
    copies = [flatten(b) for b in kept]
    again = batches(runner, plans)
    storages = {b["label"].untyped_storage().data_ptr() for b in kept}
    assert len(storages) == len(kept)  # none of the kept batches was handed out again
    for batch, copy in zip(kept, copies):
        for key, value in flatten(batch).items():
            assert value == copy[key] if key == "sparse.keys" else torch.equal(value, copy[key])
    for a, b in zip(kept, again):
        assert torch.equal(a["sparse"]["values"], b["sparse"]["values"])
    del kept, again, copies
    reused = runner._ring.reused
    for batch, _ in runner.batches(iter(plans)):  # a trainer that lets each batch go
        del batch
    assert runner._ring.reused > reused


def cpu_buffers(runner, monkeypatch):
    """The runner's batch buffers in ordinary memory (this machine may have no CUDA for pinned memory)."""
    def buffer(nbytes):
        tensor = torch.empty(nbytes, dtype=torch.uint8)
        return tensor, tensor.numpy()

    monkeypatch.setattr(runner._batch_arrays, "buffer", buffer)


def test_for_the_gpu_one_buffer_carries_only_the_raw_columns(criteo_files, monkeypatch):
    spec = criteo(criteo_files / "conv", table_sizes=1000)
    source = open_source(spec.source)
    plan = BatchPlan(np.arange(100, 612), np.ones(512, bool))
    runner = feature_runner(spec, cut=1, device="cuda", source=source)  # parse on the CPU, the rest on the GPU
    cpu_buffers(runner, monkeypatch)
    tensor, layout = runner._host_part(plan)
    crossed = transfer.unpack(tensor.numpy(), layout, transfer.cupy_view)
    assert set(crossed) == {"label", "dense_raw", "categorical_raw", "index"}
    assert tensor.numel() == sum(transfer.aligned(a.nbytes) for a in crossed.values())  # nothing else inside
    assert tensor.numel() / 512 == 4 + 13 * 4 + 26 * 8 + 8
    reference, bad = spec.stages[0].read(source, plan.indices)
    for name in ("label", "dense_raw", "categorical_raw"):
        assert np.array_equal(crossed[name].view(np.uint8), reference[name].view(np.uint8)), name
    assert np.array_equal(crossed["index"], plan.indices)


@pytest.fixture(scope="module")
def generic(tmp_path_factory):
    """A schema of every feature kind, interleaved, over Parquet with floats, lists and missing values."""
    rng = np.random.default_rng(8)
    n = 3000
    path = tmp_path_factory.mktemp("generic") / "rows.parquet"
    pq.write_table(pa.table({
        "y": rng.integers(0, 2, n), "age": [None if rng.random() < 0.2 else float(v) for v in rng.normal(40, 15, n)],
        "clicks": [None if rng.random() < 0.3 else int(v) for v in rng.integers(-5, 10**6, n)],
        "city": [None if rng.random() < 0.1 else int(v) for v in rng.integers(0, 2**32, n)],
        "shop": rng.integers(-(2**40), 2**40, n),
        "tags": pa.array([list(rng.integers(-50, 50, rng.integers(0, 6))) for _ in range(n)],
                         type=pa.list_(pa.int64()))}),
        path, row_group_size=700)
    files = TabularFiles(path, "parquet", (
        Column("y", ColumnKind.INT), Column("age", ColumnKind.FLOAT), Column("clicks", ColumnKind.INT),
        Column("city", ColumnKind.INT), Column("shop", ColumnKind.INT), Column("tags", ColumnKind.INT_LIST)))
    schema = Schema("y", (Categorical("shop", 1009, seed=4), Dense("clicks"),
                          Dense("age", clip_min=None, log1p=False, boundaries=(18, 30, 65)),
                          Cross("city", "shop", 500, seed=2), MultiHot("tags", 100, seed=3, max_len=4),
                          Categorical("city", 1000, seed=1)))
    return tabular(schema, files), pq.read_table(path).to_pydict()


def test_sparse_keys_follow_the_schema(generic):
    spec, columns = generic
    rows = [5, 2999, 0, 1234]
    (batch,) = batches(feature_runner(spec), [BatchPlan(np.array(rows), np.ones(4, bool))])
    sparse = batch["sparse"]
    assert sparse["keys"] == ["shop", "age", "city_x_shop", "tags", "city"]  # Dense("age") is bucketized: a key

    def le8(v):
        return int(v).to_bytes(8, "little", signed=True)

    def value(name, r):
        v = columns[name][r]
        return -1 if v is None else v

    expected = {
        "shop": [[murmurhash3_32(le8(value("shop", r)), 4, positive=True) % 1009] for r in rows],
        "age": [[sum(np.float32(columns["age"][r] if columns["age"][r] is not None else 0.0) >= b
                     for b in (18, 30, 65))] for r in rows],
        "city_x_shop": [[murmurhash3_32(le8(value("city", r)) + le8(value("shop", r)), 2, positive=True) % 500]
                        for r in rows],
        "tags": [[murmurhash3_32(le8(t), 3, positive=True) % 100 for t in columns["tags"][r][:4]] for r in rows],
        "city": [[murmurhash3_32(le8(value("city", r)), 1, positive=True) % 1000] for r in rows],
    }
    values, offsets = sparse["values"].tolist(), sparse["offsets"].tolist()
    for k, key in enumerate(sparse["keys"]):
        got = [values[offsets[k * 4 + i]:offsets[k * 4 + i + 1]] for i in range(4)]
        assert got == expected[key], key
    assert batch["dense"].shape == (4, 1)  # only "clicks": the bucketized "age" is not a dense column


def to_device(tree):
    """Every NumPy array of a nested structure as a stand-in CuPy array."""
    arrays: list = []
    shape = transfer._leaves(tree, arrays)
    return transfer._rebuild(shape, [dev(a) for a in arrays])


@pytest.mark.skipif(CXX is None, reason="g++ not found")
def test_every_gpu_cut_on_the_emulated_gpu_gives_the_cpu_batches(generic, criteo_files, gpu, monkeypatch):
    """The host part of a GPU placement (its one buffer), then the GPU stages on the emulated GPU (the CUDA
    kernels compiled for the host), against the all-CPU batch."""
    import sys

    for spec in (generic[0], criteo(criteo_files / "conv", table_sizes=1_000_003)):
        source = open_source(spec.source)
        plans = list(EpochSampler(min(len(source), 3000), 700, shuffle=True, seed=2, last_batch="pad").epoch(0))
        cpu = batches(feature_runner(spec, source=source), plans)
        for cut in spec.valid_cuts()[:-1]:
            runner = feature_runner(spec, cut, "cuda", source=source)
            cpu_buffers(runner, monkeypatch)
            for plan, want in zip(plans, cpu, strict=True):
                tensor, layout = runner._host_part(plan)
                data = transfer.unpack(dev(tensor.numpy()), layout, transfer.cupy_view)
                out = runner.run_stages(data, sys.modules["cupy"])
                got = flatten(out)
                for key, value in flatten(want).items():
                    if key == "sparse.keys":
                        continue
                    mine = np.asarray(got[key])
                    assert isinstance(got[key], FakeDeviceArray) or key in ("index", "valid"), (cut, key)
                    assert np.array_equal(mine, value.numpy()), (spec.name, cut, key)
        assert {"fl_hash_columns", "fl_normalize_columns"} <= set(gpu)


@pytest.mark.skipif(CXX is None, reason="g++ not found")
def test_a_timer_times_every_gpu_stage_and_changes_no_value(criteo_files, gpu, monkeypatch):
    """The GPU stages timed by a profiling caller's StageTimer (the stream synchronised around each stage) give
    the values they give untimed (NO_TIMER, nothing synchronised), and each stage has its seconds."""
    import sys

    from feedline.loader.runners.contract import StageTimer

    class Stream:
        synchronized = 0

        def synchronize(self):
            Stream.synchronized += 1

    spec = criteo(criteo_files / "conv", table_sizes=1000)
    source = open_source(spec.source)
    plan = BatchPlan(np.arange(300, 812), np.ones(512, bool))
    runner = feature_runner(spec, 1, "cuda", source=source)
    cpu_buffers(runner, monkeypatch)
    runs = []
    for timer in (None, StageTimer(time.perf_counter)):
        tensor, layout = runner._host_part(plan)
        data = transfer.unpack(dev(tensor.numpy()), layout, transfer.cupy_view)
        out = runner.run_stages(data, sys.modules["cupy"]) if timer is None else \
            runner.run_stages(data, sys.modules["cupy"], Stream(), timer)
        runs.append({k: np.asarray(v) for k, v in flatten(out).items() if k != "sparse.keys"})
    assert runs[0].keys() == runs[1].keys() and all(np.array_equal(runs[0][k], runs[1][k]) for k in runs[0])
    gpu_stages = [stage.name for stage in spec.stages[1:]]
    assert list(timer.seconds) == gpu_stages and all(s >= 0 for s in timer.seconds.values())
    assert Stream.synchronized == 2 * len(gpu_stages)
