"""Criteo rows end to end, checked value by value against an independent computation (Python int, math.log1p,
scikit-learn's MurmurHash3), and the TorchRec KeyedJaggedTensor layout of the sparse output."""
import math

import numpy as np
import pytest
import torch
from sklearn.utils import murmurhash3_32

from runners import feature_runner
from feedline.loader.sampler import BatchPlan, EpochSampler
from feedline.pipelines.criteo import CATEGORICAL_NAMES, criteo

TABLE = 1000

# label, I1..I13, C1..C26 as they appear in the file ("" = missing).
ROWS = [
    ["1", ["1", "-1", "0", "", "12345678901", "7", "", "0", "3", "", "99", "1000000", "5"],
     ["68fd1e64", "", "FFFFFFFF", "0", "1", "deadbeef", "00000000", "80000000", "7fffffff", "a", "Bc", "",
      "05db9164", "38a947a1", "", "cf1cde40", "25c83c98", "7e0ccccf", "", "0b153874", "a73ee510", "3b08e48b",
      "d8d3ea58", "", "e5ba7672", "b28479f6"]],
    ["0", ["", "", "", "", "", "", "", "", "", "", "", "", ""],
     [""] * 26],
    ["0", ["0", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13"],
     [f"{j:08x}" for j in range(26)]],
    ["1", ["65535", "65536", "-3", "1", "1", "1", "1", "1", "1", "1", "1", "1", "999999999999"],
     [f"{(j * 2654435761) % 2**32:x}" for j in range(26)]],
    ["0", ["3", "", "1", "", "2", "", "0", "", "8", "", "4", "", "6"],
     ["fffffffe", "", "1", "", "22", "", "333", "", "4444", "", "55555", "", "666666", "", "7777777", "",
      "88888888", "", "9", "", "aa", "", "bbb", "", "cccc", ""]],
]


def write_rows(path, rows=ROWS, trailing_newline=False):
    text = "\n".join("\t".join([label, *dense, *cats]) for label, dense, cats in rows)
    path.write_text(text + ("\n" if trailing_newline else ""))
    return path


def expected(rows=ROWS, table=TABLE):
    label = np.array([float(r[0]) for r in rows], dtype=np.float32)
    dense = np.array([[math.log1p(max(int(x), 0)) if x else 0.0 for x in r[1]] for r in rows], dtype=np.float32)
    ids = np.array([[murmurhash3_32((int(x, 16) if x else -1).to_bytes(8, "little", signed=True), seed=j,
                                    positive=True) % table for j, x in enumerate(r[2])] for r in rows])
    return label, dense, ids


def run(spec, plans, **kw):
    runner = feature_runner(spec, **kw)
    return runner, [b for b, _ in runner.batches(iter(plans))]


def plan(indices):
    indices = np.asarray(indices, dtype=np.int64)
    return BatchPlan(indices, np.ones(indices.size, dtype=bool))


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


@pytest.mark.parametrize("trailing_newline", [False, True])
def test_rows_match_an_independent_computation(tmp_path, trailing_newline):
    spec = criteo(write_rows(tmp_path / "day.tsv", trailing_newline=trailing_newline), table_sizes=TABLE)
    order = [3, 0, 4, 1, 2]
    runner, (batch,) = run(spec, [plan(order)])
    assert runner.num_samples == len(ROWS)
    label, dense, ids = expected()
    assert batch["label"].dtype == torch.float32 and batch["dense"].dtype == torch.float32
    assert batch["index"].tolist() == order
    assert "valid" not in batch
    np.testing.assert_array_equal(batch["label"].numpy(), label[order])
    assert ulps(batch["dense"].numpy(), dense[order]).max() <= 1  # ops' log1p is within one float32 ulp
    values = batch["sparse"]["values"].numpy().reshape(26, len(order))
    np.testing.assert_array_equal(values.T, ids[order])


def test_table_sizes_per_feature(tmp_path):
    sizes = [7 + 3 * j for j in range(26)]
    spec = criteo(write_rows(tmp_path / "day.tsv"), table_sizes=sizes)
    _, (batch,) = run(spec, [plan(range(len(ROWS)))])
    raw = np.array([[murmurhash3_32((int(x, 16) if x else -1).to_bytes(8, "little", signed=True), seed=j,
                                    positive=True) for j, x in enumerate(r[2])] for r in ROWS])
    values = batch["sparse"]["values"].numpy().reshape(26, -1).T
    np.testing.assert_array_equal(values, raw % np.array(sizes))


def test_sparse_layout_is_keyed_jagged(tmp_path):
    spec = criteo(write_rows(tmp_path / "day.tsv"), table_sizes=TABLE)
    _, batches = run(spec, EpochSampler(len(ROWS), 2, shuffle=False).epoch(0))
    for batch in batches:
        sparse, b = batch["sparse"], batch["label"].shape[0]
        assert sparse["keys"] == list(CATEGORICAL_NAMES)
        assert sparse["values"].dtype == torch.int64 and sparse["lengths"].dtype == torch.int32
        assert sparse["offsets"].dtype == torch.int64
        assert sparse["lengths"].shape == (26 * b,) and bool((sparse["lengths"] == 1).all())
        assert sparse["offsets"].tolist() == [0, *np.cumsum(sparse["lengths"].numpy()).tolist()]
        assert sparse["values"].shape == (int(sparse["offsets"][-1]),)
        _, _, ids = expected()
        rows = batch["index"].numpy()
        key_major = np.concatenate([ids[rows, k] for k in range(26)])
        np.testing.assert_array_equal(sparse["values"].numpy(), key_major)


def test_torchrec_accepts_the_sparse_dict(tmp_path):
    torchrec = pytest.importorskip("torchrec", reason="torchrec not installed; the layout test checks the invariants")
    spec = criteo(write_rows(tmp_path / "day.tsv"), table_sizes=TABLE)
    _, (batch,) = run(spec, [plan(range(len(ROWS)))])
    kjt = torchrec.sparse.jagged_tensor.KeyedJaggedTensor(**batch["sparse"])
    assert kjt.keys() == list(CATEGORICAL_NAMES)
    assert kjt["C1"].lengths().tolist() == [1] * len(ROWS)


def test_padding_is_marked_invalid(tmp_path):
    spec = criteo(write_rows(tmp_path / "day.tsv"), table_sizes=TABLE)
    _, (batch,) = run(spec, [BatchPlan(np.array([0, 1, 0]), np.array([True, True, False]))])
    assert batch["valid"].tolist() == [True, True, False]
    assert batch["index"].tolist() == [0, 1, 0]


def test_missing_values_use_documented_defaults(tmp_path):
    spec = criteo(write_rows(tmp_path / "day.tsv"), table_sizes=TABLE)
    _, (batch,) = run(spec, [plan([1])])  # the row with every value missing
    assert batch["dense"].abs().sum() == 0
    missing = [murmurhash3_32((-1).to_bytes(8, "little", signed=True), seed=j, positive=True) % TABLE
               for j in range(26)]
    assert batch["sparse"]["values"].tolist() == missing
