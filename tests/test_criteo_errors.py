"""Bad input: every error names the file and the 1-based line; with on_error="skip" the bad rows are left out,
counted and listed, and every good row still arrives exactly once with the right values."""
import gzip

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from feedline.loader import DataError
from feedline.loader.sources import open_source
from runners import batches as run_plans
from runners import feature_runner
from feedline.loader.sampler import EpochSampler
from feedline.loader.sources.tabular import MissingFileError, RowError
from feedline.pipelines.criteo import CATEGORICAL_NAMES, DENSE_NAMES, criteo


def good_fields(i: int) -> list[str]:
    return [str(i % 2)] + [str(i * 13 + j) for j in range(13)] + [f"{(i * 26 + j) * 7919:08x}" for j in range(26)]


def line(fields) -> str:
    return "\t".join(fields)


def with_field(i: int, index: int, value: str) -> str:
    fields = good_fields(i)
    fields[index] = value
    return line(fields)


GOOD = [line(good_fields(i)) for i in range(8)]
BAD_LINES = {  # 1-based line in the file -> (text, what the error says)
    2: (line(good_fields(100)[:-1]), "expected 40 tab-separated fields, found 39"),
    4: (with_field(101, 14 + 4, "xyz1"), "column C5 (field 19): 'xyz1' is not a hexadecimal integer"),
    5: (with_field(102, 3, "abc"), "column I3 (field 4): 'abc' is not a decimal integer"),
    7: (with_field(103, 1, "nan"), "column I1 (field 2): 'nan' is not a decimal integer"),
    8: (with_field(104, 13, "99999999999999999999"), "column I13 (field 14): '99999999999999999999' is out of int64 range"),
    10: (with_field(105, 0, ""), "column label (field 1): is empty, and a value is required"),
    11: (with_field(106, 2, "1.5"), "column I2 (field 3): '1.5' is not a decimal integer"),
    12: (with_field(107, 39, "8000000000000000"), "column C26 (field 40): '8000000000000000' is out of int64 range"),
    13: (line(good_fields(108)) + "\r", "control character 0x0d in the line (Windows line ending?)"),
    14: ("", "expected 40 tab-separated fields, found 1"),
}


def mixed_file(path):
    """The GOOD lines with the BAD_LINES in between, at their line numbers."""
    lines, good = [], iter(GOOD)
    for number in range(1, len(GOOD) + len(BAD_LINES) + 1):
        lines.append(BAD_LINES[number][0] if number in BAD_LINES else next(good))
    path.write_text("\n".join(lines) + "\n")
    return path


def epoch_by_index(spec):
    runner = feature_runner(spec)
    batches = run_plans(runner, EpochSampler(runner.num_samples, 3, shuffle=True, seed=2).epoch(0))
    order = np.argsort(torch.cat([b["index"] for b in batches]).numpy())
    dense = torch.cat([b["dense"] for b in batches])[order]
    ids = torch.cat([b["sparse"]["values"].reshape(26, -1).T for b in batches])[order]
    return runner, dense, ids


@pytest.mark.parametrize("number", sorted(BAD_LINES))
def test_each_bad_line_raises_naming_file_and_line(tmp_path, number):
    path = tmp_path / "day.tsv"
    text, reason = BAD_LINES[number]
    path.write_text("\n".join([GOOD[0], text, GOOD[1]]) + "\n")
    spec = criteo(path)
    with pytest.raises(DataError) as info:
        feature_runner(spec)
    assert isinstance(info.value, ValueError) and isinstance(info.value, RowError)
    assert (info.value.file, info.value.line) == (str(path), 2)
    assert str(info.value) == f"{path}:2: {reason}"


def test_skip_leaves_out_bad_rows_and_lists_them(tmp_path):
    spec = criteo(mixed_file(tmp_path / "day.tsv"), on_error="skip")
    runner, dense, ids = epoch_by_index(spec)
    assert runner.num_samples == len(GOOD)
    assert [s.where for s in runner.skipped] == [f"{tmp_path / 'day.tsv'}:{n}" for n in sorted(BAD_LINES)]
    assert [s.reason for s in runner.skipped] == [BAD_LINES[n][1] for n in sorted(BAD_LINES)]
    clean = tmp_path / "clean.tsv"
    clean.write_text("\n".join(GOOD) + "\n")
    _, clean_dense, clean_ids = epoch_by_index(criteo(clean))
    assert torch.equal(dense, clean_dense) and torch.equal(ids, clean_ids)


def test_raise_reports_the_first_bad_line(tmp_path):
    path = mixed_file(tmp_path / "day.tsv")
    with pytest.raises(RowError, match=f"^{path}:2: expected 40"):
        open_source(criteo(path).source)


def test_gzip_errors_name_the_gzip_file(tmp_path):
    path = tmp_path / "day.tsv.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join([GOOD[0], GOOD[1], BAD_LINES[4][0]]))
    with pytest.raises(RowError, match=f"^{path}:3: column C5"):
        open_source(criteo(path).source)


def test_edge_values_that_are_valid(tmp_path):
    path = tmp_path / "day.tsv"
    fields = good_fields(0)
    fields[1:4] = ["9223372036854775807", "-9223372036854775807", "0000000000000000000000012"]
    fields[14:17] = ["7fffffffffffffff", "00000000000000000000ff", "ABCDEF"]
    path.write_text(line(fields) + "\n")
    reader = open_source(criteo(path).source)
    columns = reader.read(np.array([0]))
    assert [int(columns[n].values[0]) for n in ("I1", "I2", "I3")] == [2**63 - 1, -(2**63 - 1), 12]
    assert [int(columns[n].values[0]) for n in ("C1", "C2", "C3")] == [2**63 - 1, 255, 0xABCDEF]


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    with pytest.raises(RowError, match="empty.tsv: file is empty"):
        open_source(criteo(empty).source)
    good = tmp_path / "good.tsv"
    good.write_text("\n".join(GOOD))
    spec = criteo([empty, good], on_error="skip")
    runner = feature_runner(spec)
    assert runner.num_samples == len(GOOD)
    assert [(s.where, s.reason) for s in runner.skipped] == [(str(empty), "file is empty")]
    with pytest.raises(RowError, match="no good rows"):
        open_source(criteo(empty, on_error="skip").source)


def test_missing_file(tmp_path):
    path = tmp_path / "nowhere.tsv"
    for on_error in ("raise", "skip"):
        with pytest.raises(MissingFileError, match="nowhere.tsv: file does not exist") as info:
            open_source(criteo(path, on_error=on_error).source)
        assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, DataError)
    with pytest.raises(FileNotFoundError):
        open_source(criteo(tmp_path / "nowhere.parquet").source)


def test_on_error_is_checked():
    with pytest.raises(ValueError, match="on_error"):
        criteo("x.tsv", on_error="ignore")


def parquet_file(path, **overrides):
    columns = {"label": pa.array([0, 1, 0, 1, 0])}
    columns.update({n: pa.array([1, None, 3, 4, 5]) for n in DENSE_NAMES})
    columns.update({n: pa.array(["a1", "b2", None, "d4", "e5"]) for n in CATEGORICAL_NAMES})
    columns.update(overrides)
    pq.write_table(pa.table(columns), path)
    return path


def test_parquet_bad_rows_name_the_row(tmp_path):
    path = parquet_file(tmp_path / "day.parquet", C7=pa.array(["a1", "b2", "zz", "d4", "e5"]),
                        I2=pa.array([1.0, float("inf"), 3.0, 4.0, 5.0]), label=pa.array([0, 1, 0, None, 0]))
    with pytest.raises(RowError, match=f"^{path}:2: column I2: inf is not an integer"):
        open_source(criteo(path).source)
    spec = criteo(path, on_error="skip")
    reader = open_source(spec.source)
    assert reader.num_rows == 2
    assert [(int(s.where.rsplit(':', 1)[1]), s.reason) for s in reader.skipped] == [
        (2, "column I2: inf is not an integer within int64 range"),
        (3, "column C7: 'zz' is not a hexadecimal integer"),
        (4, "column label: is empty, and a value is required")]
    assert reader.read(np.array([0, 1]))["C1"].values.tolist() == [0xA1, 0xE5]


def test_parquet_missing_column_and_wrong_type(tmp_path):
    table = pq.read_table(parquet_file(tmp_path / "full.parquet")).drop_columns(["C3"])
    pq.write_table(table, tmp_path / "partial.parquet")
    with pytest.raises(RowError, match=r"partial.parquet: has no column\(s\) \['C3'\]"):
        open_source(criteo(tmp_path / "partial.parquet").source)
    path = parquet_file(tmp_path / "typed.parquet", C1=pa.array([1.5, 2.0, 3.0, 4.0, 5.0]))
    with pytest.raises(RowError, match="column C1 has type double, expected hex strings or integers"):
        open_source(criteo(path).source)
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(RowError, match="junk.parquet: is not a readable Parquet file"):
        open_source(criteo(tmp_path / "junk.parquet").source)


def test_errors_survive_pickling(tmp_path):
    import pickle

    for error in (RowError(str(tmp_path / "a.tsv"), 3, "bad"), MissingFileError(str(tmp_path / "b.tsv"))):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error) and (copy.file, copy.line) == (error.file, error.line)
