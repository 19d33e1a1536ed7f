"""The same rows as plain TSV, gzip TSV, Parquet with hex strings and Parquet with integer columns (as pandas
writes them: floats with NaN for the dense counts) give identical batches."""
import gzip
import shutil

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from feedline.datagen.synthetic_criteo import make_criteo
from runners import feature_runner
from feedline.loader.sampler import EpochSampler
from feedline.pipelines.criteo import CATEGORICAL_NAMES, DENSE_NAMES, criteo

ROWS = 3000


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("criteo_formats")
    tsv = root / "day.tsv"
    make_criteo(tsv, ROWS, seed=5)
    gz = root / "day.tsv.gz"
    with open(tsv, "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    hex_parquet = root / "day.parquet"
    make_criteo(hex_parquet, ROWS, seed=5, format="parquet")
    df = pd.read_csv(tsv, sep="\t", header=None, names=["label", *DENSE_NAMES, *CATEGORICAL_NAMES])
    columns = {"label": pa.array(df["label"].to_numpy())}
    columns.update({n: pa.array(df[n].to_numpy(dtype=np.float64)) for n in DENSE_NAMES})  # NaN = missing
    for n in CATEGORICAL_NAMES:
        ints = [None if isinstance(x, float) else int(x, 16) for x in df[n]]
        columns[n] = pa.array(ints, type=pa.uint32())
    int_parquet = root / "day_int.parquet"
    pq.write_table(pa.table(columns), int_parquet)
    unnamed = root / "day.data"  # no telling suffix: "auto" reads it as TSV
    shutil.copy(tsv, unnamed)
    return {"tsv": tsv, "gz": gz, "hex_parquet": hex_parquet, "int_parquet": int_parquet, "unnamed": unnamed}


def epoch(path, **kw):
    spec = criteo(path, table_sizes=10007, **kw)
    runner = feature_runner(spec, num_threads=2)
    assert runner.num_samples == ROWS
    return [b for b, _ in runner.batches(EpochSampler(ROWS, 512, shuffle=True, seed=1).epoch(0))]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for key in ("label", "dense", "index"):
            assert torch.equal(x[key], y[key]), key
        for key in ("values", "lengths", "offsets"):
            assert torch.equal(x["sparse"][key], y["sparse"][key]), key


@pytest.fixture(scope="module")
def reference(files):
    return epoch(files["tsv"])


@pytest.mark.parametrize("kind", ["gz", "hex_parquet", "int_parquet", "unnamed"])
def test_formats_agree(files, reference, kind):
    assert_same(epoch(files[kind]), reference)


def test_explicit_format(files, reference):
    assert_same(epoch(files["gz"], format="tsv"), reference)
    with pytest.raises(ValueError, match="format"):
        criteo(files["tsv"], format="csv")


def test_mixed_formats_need_an_explicit_format(files):
    with pytest.raises(ValueError, match="paths mix formats"):
        criteo([files["tsv"], files["hex_parquet"]])


def test_rows_count_over_files_in_order(files, tmp_path):
    lines = files["tsv"].read_bytes().splitlines(keepends=True)
    first, second = tmp_path / "a.tsv", tmp_path / "b.tsv.gz"
    first.write_bytes(b"".join(lines[:1000]))
    with gzip.open(second, "wb") as f:
        f.write(b"".join(lines[1000:]))
    spec = criteo([first, second], table_sizes=10007)
    runner = feature_runner(spec)
    assert len(runner.source) == ROWS
    batches = [b for b, _ in runner.batches(EpochSampler(ROWS, 512, shuffle=True, seed=1).epoch(0))]
    reference = epoch(files["tsv"])
    assert_same(batches, reference)
