"""Bad input: every error names the file and the 1-based line; with on_error="skip" the bad rows are left out,
counted and listed, and every good row still arrives exactly once with the right values."""
import gzip

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from feedline.loader import DataError, Loader
from feedline.loader.sources import open_source
from feedline.loader.sources.table_rows import MissingFileError, RowError
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


def epoch_by_index(spec, **kwargs):
    """One shuffled epoch of a Loader: (loader, dense and ids of the valid rows, by row index)."""
    loader = Loader(spec, batch_size=3, placement="cpu", seed=2, **kwargs)
    batches = list(loader)
    valid = torch.cat([b.get("valid", torch.ones(len(b["index"]), dtype=torch.bool)) for b in batches])
    index = torch.cat([b["index"] for b in batches])[valid]
    order = np.argsort(index.numpy())
    dense = torch.cat([b["dense"] for b in batches])[valid][order]
    ids = torch.cat([b["sparse"]["values"].reshape(26, -1).T for b in batches])[valid][order]
    return loader, index[order], dense, ids


@pytest.mark.parametrize("number", sorted(BAD_LINES))
def test_each_bad_line_raises_naming_file_and_line(tmp_path, number):
    """Rows are checked when their part of the file is read: the batch holding the bad line raises."""
    path = tmp_path / "day.tsv"
    text, reason = BAD_LINES[number]
    path.write_text("\n".join([GOOD[0], text, GOOD[1]]) + "\n")
    loader = Loader(criteo(path), batch_size=1, placement="cpu", shuffle=False)
    assert len(loader) == 3  # every line counts; the bad one is found when read
    with pytest.raises(DataError) as info:
        list(loader)
    assert isinstance(info.value, ValueError) and isinstance(info.value, RowError)
    assert (info.value.file, info.value.line) == (str(path), 2)
    assert str(info.value) == f"{path}:2: {reason}"


def test_skip_leaves_out_bad_rows_and_lists_them(tmp_path):
    spec = criteo(mixed_file(tmp_path / "day.tsv"), on_error="skip")
    loader, index, dense, ids = epoch_by_index(spec)
    assert len(loader.source) == len(GOOD) + len(BAD_LINES)  # a row's index is its line: bad lines count
    good_lines = [n for n in range(1, len(GOOD) + len(BAD_LINES) + 1) if n not in BAD_LINES]
    assert index.tolist() == [n - 1 for n in good_lines]
    assert sorted(s.where for s in loader.skipped) == sorted(f"{tmp_path / 'day.tsv'}:{n}" for n in BAD_LINES)
    assert {s.where: s.reason for s in loader.skipped} == {f"{tmp_path / 'day.tsv'}:{n}": BAD_LINES[n][1]
                                                           for n in BAD_LINES}
    clean = tmp_path / "clean.tsv"
    clean.write_text("\n".join(GOOD) + "\n")
    _, _, clean_dense, clean_ids = epoch_by_index(criteo(clean))
    assert torch.equal(dense, clean_dense) and torch.equal(ids, clean_ids)


def test_raise_reports_the_first_bad_line_in_file_order(tmp_path):
    path = mixed_file(tmp_path / "day.tsv")
    with pytest.raises(RowError, match=f"^{path}:2: expected 40"):
        list(Loader(criteo(path), batch_size=4, placement="cpu", shuffle=False))


def test_gzip_errors_name_the_gzip_file(tmp_path):
    path = tmp_path / "day.tsv.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join([GOOD[0], GOOD[1], BAD_LINES[4][0]]))
    with pytest.raises(RowError, match=f"^{path}:3: column C5"):
        list(Loader(criteo(path), batch_size=2, placement="cpu"))
    truncated = tmp_path / "cut.tsv.gz"
    with gzip.open(truncated, "wt") as f:
        f.write("\n".join(GOOD * 200))
    truncated.write_bytes(truncated.read_bytes()[:-40])
    with pytest.raises(RowError, match=f"^{truncated}: is not a readable gzip file"):
        open_source(criteo(truncated).source)


def test_edge_values_that_are_valid(tmp_path):
    path = tmp_path / "day.tsv"
    fields = good_fields(0)
    fields[1:4] = ["9223372036854775807", "-9223372036854775807", "0000000000000000000000012"]
    fields[14:17] = ["7fffffffffffffff", "00000000000000000000ff", "ABCDEF"]
    path.write_text(line(fields) + "\n")
    columns = open_source(criteo(path).source).read(np.array([0])).columns
    assert [int(columns[n].values[0]) for n in ("I1", "I2", "I3")] == [2**63 - 1, -(2**63 - 1), 12]
    assert [int(columns[n].values[0]) for n in ("C1", "C2", "C3")] == [2**63 - 1, 255, 0xABCDEF]


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    with pytest.raises(RowError, match="empty.tsv: file is empty"):
        open_source(criteo(empty).source)
    good = tmp_path / "good.tsv"
    good.write_text("\n".join(GOOD))
    source = open_source(criteo([empty, good], on_error="skip").source)
    assert source.num_rows == len(GOOD)
    assert [(s.where, s.reason) for s in source.skipped] == [(str(empty), "file is empty")]
    with pytest.raises(RowError, match="no rows"):
        open_source(criteo(empty, on_error="skip").source)


def test_missing_file(tmp_path):
    path = tmp_path / "nowhere.tsv"
    for on_error in ("raise", "skip"):
        with pytest.raises(MissingFileError, match="nowhere.tsv: file does not exist") as info:
            open_source(criteo(path, on_error=on_error).source)
        assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, DataError)
    with pytest.raises(FileNotFoundError):
        open_source(criteo(tmp_path / "nowhere.parquet").source)
    good = tmp_path / "good.tsv"
    good.write_text("\n".join(GOOD))
    with pytest.raises(MissingFileError, match="day_1.tsv: file does not exist"):
        open_source(criteo([good, tmp_path / "day_1.tsv"]).source)
    with pytest.raises(MissingFileError, match=r"day_\*.tsv: no file matches this pattern"):
        open_source(criteo(str(tmp_path / "day_*.tsv")).source)


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
        list(Loader(criteo(path), batch_size=5, placement="cpu", shuffle=False))
    loader, index, _, ids = epoch_by_index(criteo(path, on_error="skip"))
    assert len(loader.source) == 5 and index.tolist() == [0, 4]
    assert sorted((int(s.where.rsplit(':', 1)[1]), s.reason) for s in loader.skipped) == [
        (2, "column I2: inf is not an integer within int64 range"),
        (3, "column C7: 'zz' is not a hexadecimal integer"),
        (4, "column label: is empty, and a value is required")]
    columns = loader.source.read(np.array([0, 4])).columns
    assert columns["C1"].values.tolist() == [0xA1, 0xE5]


def test_parquet_missing_column_and_wrong_type(tmp_path):
    table = pq.read_table(parquet_file(tmp_path / "full.parquet")).drop_columns(["C3"])
    pq.write_table(table, tmp_path / "partial.parquet")
    with pytest.raises(RowError, match=r"partial.parquet: has no column\(s\) \['C3'\]"):
        open_source(criteo(tmp_path / "partial.parquet").source)
    path = parquet_file(tmp_path / "typed.parquet", C1=pa.array([1.5, 2.0, 3.0, 4.0, 5.0]))
    with pytest.raises(RowError, match="column C1 has type double, expected hex strings or integers"):
        list(Loader(criteo(path), batch_size=5, placement="cpu"))
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(RowError, match="junk.parquet: is not a readable Parquet file"):
        open_source(criteo(tmp_path / "junk.parquet").source)


def test_errors_survive_pickling(tmp_path):
    import pickle

    for error in (RowError(str(tmp_path / "a.tsv"), 3, "bad"), MissingFileError(str(tmp_path / "b.tsv"))):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error) and (copy.file, copy.line) == (error.file, error.line)


def test_gzip_of_several_members_and_zero_padding_reads_as_one_file(tmp_path):
    path = tmp_path / "day.tsv.gz"
    path.write_bytes(gzip.compress(("\n".join(GOOD[:5]) + "\n").encode()) + gzip.compress(b"")
                     + gzip.compress(("\n".join(GOOD[5:]) + "\n").encode()) + b"\0" * 512)
    loader = Loader(criteo(path, table_sizes=1 << 30), batch_size=3, placement="cpu", shuffle=False)
    assert len(loader.source) == len(GOOD)
    labels = torch.cat([b["label"] for b in loader]).tolist()
    assert labels == [float(g.split("\t")[0]) for g in GOOD]
    assert loader.source.where(6) == f"{path}:7"


@pytest.mark.parametrize("damage,why", [
    (lambda data: data[:-8] + bytes(4) + data[-4:], "corrupt"),        # a wrong CRC in the trailer
    (lambda data: data + b"trailing junk", "other data after its last gzip member"),
    (lambda data: data[:len(data) // 2], "cut short"),
])
def test_a_damaged_gzip_file_is_an_error_at_opening_naming_it(tmp_path, damage, why):
    path = tmp_path / "day.tsv.gz"
    path.write_bytes(damage(gzip.compress(("\n".join(GOOD * 50) + "\n").encode())))
    with pytest.raises(RowError, match=f"^{path}: is not a readable gzip file: .*{why}"):
        open_source(criteo(path).source)
