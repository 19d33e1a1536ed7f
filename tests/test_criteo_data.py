"""The synthetic Criteo generator (deterministic, Criteo-like statistics) and the benchmark's result shape."""
import numpy as np
import pandas as pd
import pytest

from feedline.benchmarks.criteo_bench import bench_criteo
from feedline.datagen.synthetic_criteo import CARDINALITIES, make_criteo
from feedline.pipelines.criteo import CATEGORICAL_NAMES, DENSE_NAMES

ROWS = 40_000


@pytest.fixture(scope="module")
def frame(tmp_path_factory):
    path = tmp_path_factory.mktemp("criteo_data") / "day.tsv"
    summary = make_criteo(path, ROWS, seed=11)
    assert summary["rows"] == ROWS and summary["path"] == str(path)
    return pd.read_csv(path, sep="\t", header=None, names=["label", *DENSE_NAMES, *CATEGORICAL_NAMES], dtype=str)


def test_same_seed_same_bytes_different_seed_different_bytes(tmp_path):
    for name, fmt in (("a.tsv", "tsv"), ("a.parquet", "parquet")):
        make_criteo(tmp_path / f"1{name}", 3000, seed=4, format=fmt)
        make_criteo(tmp_path / f"2{name}", 3000, seed=4, format=fmt)
        make_criteo(tmp_path / f"3{name}", 3000, seed=5, format=fmt)
        assert (tmp_path / f"1{name}").read_bytes() == (tmp_path / f"2{name}").read_bytes()
        assert (tmp_path / f"1{name}").read_bytes() != (tmp_path / f"3{name}").read_bytes()


def test_statistics_look_like_criteo(frame):
    assert len(frame) == ROWS and frame.shape[1] == 40
    assert 0.23 < (frame["label"] == "1").mean() < 0.27
    missing = frame[[*DENSE_NAMES, *CATEGORICAL_NAMES]].isna().mean()
    assert missing.between(0.03, 0.42).all()
    assert frame["label"].notna().all()
    dense = frame[list(DENSE_NAMES)].astype(float)
    assert (dense["I2"] < 0).mean() > 0.03
    assert (dense.drop(columns="I2").fillna(0) >= 0).all(axis=None)
    assert (dense.max() > 20 * dense.median()).all()  # long tails
    for name, cardinality in zip(CATEGORICAL_NAMES, CARDINALITIES):
        values = frame[name].dropna()
        assert values.str.fullmatch("[0-9a-f]{8}").all()
        counts = values.value_counts()
        assert counts.size <= cardinality
        if cardinality >= 1000:
            assert counts.iloc[0] > 20 * counts.median()  # power law: a head far above the typical value
    assert min(CARDINALITIES) <= 12 and max(CARDINALITIES) >= 1_000_000


def test_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="rows"):
        make_criteo(tmp_path / "x.tsv", 0, seed=0)
    with pytest.raises(ValueError, match="seed"):
        make_criteo(tmp_path / "x.tsv", 10, seed=-1)
    with pytest.raises(ValueError, match="format"):
        make_criteo(tmp_path / "x.tsv", 10, seed=0, format="csv")


def test_bench_reports_both_sides(tmp_path, kernels_warmed_once):
    make_criteo(tmp_path / "day.tsv", 5000, seed=0)
    result = bench_criteo(tmp_path / "day.tsv", batch_size=1024, baseline_rows=2000)
    assert result["pipeline"] == "criteo" and result["placement"] == "cpu"
    assert result["rows"] == 5000 and result["baseline_rows"] == 2000
    for key in ("feedline_samples_per_s", "baseline_samples_per_s", "speedup", "feedline_first_epoch_samples_per_s"):
        assert result[key] > 0
    timed = bench_criteo(tmp_path / "day.tsv", batch_size=512, batches=3, baseline=False)
    assert timed["rows"] == 3 * 512 and "speedup" not in timed


def test_baseline_and_feedline_agree_row_by_row(tmp_path):
    """Both sides of the benchmark compute the same features from the same rows: equal labels, dense values
    within one float32 ulp (pandas uses the platform's float32 log1p), and categorical ids that differ only in
    the final mapping (the baseline's ``int(x, 16) % n``, feedline's MurmurHash3 of the same id ``% n``)."""
    from sklearn.utils import murmurhash3_32

    from feedline.benchmarks.criteo_bench import TABLE_SIZE, pandas_features
    from runners import batches as run_plans
    from runners import feature_runner
    from feedline.loader.sampler import EpochSampler
    from feedline.pipelines.criteo import criteo

    path = tmp_path / "day.tsv"
    make_criteo(path, 3000, seed=3)
    label, dense, raw = pandas_features(str(path), table_size=None)
    _, _, reduced = pandas_features(str(path), nrows=50)
    assert (reduced == raw[:50] % TABLE_SIZE).all()

    spec = criteo(path, table_sizes=TABLE_SIZE)
    runner = feature_runner(spec)
    batches = run_plans(runner, EpochSampler(runner.num_samples, 1000, shuffle=False).epoch(0))
    assert runner.num_samples == len(label) == 3000
    ours_label = np.concatenate([b["label"].numpy() for b in batches])
    ours_dense = np.concatenate([b["dense"].numpy() for b in batches])
    ours_ids = np.concatenate([b["sparse"]["values"].numpy().reshape(26, -1).T for b in batches])
    np.testing.assert_array_equal(ours_label, label)
    np.testing.assert_array_max_ulp(ours_dense, dense, maxulp=1)
    assert (raw == -1).any() and (raw >= 1 << 31).any()  # missing ids, and ids beyond int32
    for row in range(0, 3000, 150):  # a few rows against scikit-learn's MurmurHash3, independently
        for j in range(26):
            key = int(raw[row, j]).to_bytes(8, "little", signed=True)
            assert ours_ids[row, j] == murmurhash3_32(key, seed=j, positive=True) % TABLE_SIZE
