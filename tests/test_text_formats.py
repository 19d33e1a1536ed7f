"""The text formats tabular users have, end to end through a Loader: CSV and TSV with or without a header,
float columns, string categoricals and list columns, checked against an independent computation (Python's
float, sklearn's MurmurHash3 of the strings' UTF-8 bytes); how a header is matched and refused; bad rows named
by file and line; and the declaration's checks."""
from __future__ import annotations

import gzip
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.utils import murmurhash3_32

from feedline import ops
from feedline.loader import DataError, Loader
from feedline.loader.sources import open_source
from feedline.loader.sources.table_rows import RowError
from feedline.loader.sources.text_parse import string_keys
from feedline.pipelines.tabular import (Categorical, Column, ColumnKind, Cross, Dense, MultiHot, Schema,
                                        TabularFiles, tabular)

K = ColumnKind
ROWS = [  # label, price (float), city (string), clicks (int), tags (list)
    ("1", "2.5", "Paris", "3", "1|2|3"),
    ("0", "", "São Paulo, SP", "", ""),
    ("1", "1e-3", 'the "big" apple', "-7", "42"),
    ("0", "0.1", "", "12", "-9223372036854775808|9223372036854775807"),
    ("1", "nan", "東京", "0", "5|5"),
    ("0", "-17.25", "Paris", "99", "7"),
]
COLUMNS = (Column("label", K.INT), Column("price", K.FLOAT), Column("city", K.STRING), Column("clicks", K.INT),
           Column("tags", K.INT_LIST))
SCHEMA = Schema("label", (Dense("price", clip_min=None, log1p=False), Categorical("city", 1000, seed=5),
                          Cross("city", "clicks", 97, seed=2), MultiHot("tags", 50, seed=3)))


def csv_field(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"') else text


def write_csv(path, header: bool = True, order=(0, 1, 2, 3, 4), extra: bool = True, crlf: bool = True,
              gz: bool = False):
    """The rows as CSV: fields in ``order`` (with a header naming them), an undeclared ``note`` column."""
    names = ["label", "price", "city", "clicks", "tags"]
    lines = []
    if header:
        lines.append(",".join([names[k] for k in order] + (["note"] if extra else [])))
    for row in ROWS:
        lines.append(",".join([csv_field(row[k]) for k in order] + (['"a, b"'] if extra else [])))
    data = ("\ufeff" if header else "").encode() + (("\r\n" if crlf else "\n").join(lines) + "\n").encode()
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def one_epoch(spec) -> dict:
    loader = Loader(spec, batch_size=len(ROWS), placement="cpu", shuffle=False)
    (batch,) = list(loader)
    return batch


def expected() -> dict:
    label = np.array([float(r[0]) for r in ROWS], dtype=np.float32)
    price = [float(r[1]) if r[1] else math.nan for r in ROWS]
    dense = np.array([[0.0 if math.isnan(p) else p] for p in price], dtype=np.float32)  # fill 0
    city = [murmurhash3_32(r[2].encode(), 5, positive=True) % 1000 if r[2] else
            murmurhash3_32((-1).to_bytes(8, "little", signed=True), 5, positive=True) % 1000 for r in ROWS]
    tags = [[murmurhash3_32(int(t).to_bytes(8, "little", signed=True), 3, positive=True) % 50
             for t in r[4].split("|")] if r[4] else [] for r in ROWS]
    return {"label": label, "dense": dense, "city": city, "tags": tags}


def check_batch(batch, want=None) -> None:
    want = want or expected()
    n = len(ROWS)
    np.testing.assert_array_equal(batch["label"].numpy(), want["label"])
    np.testing.assert_array_equal(batch["dense"].numpy(), want["dense"])
    sparse = batch["sparse"]
    assert list(sparse["keys"]) == ["city", "city_x_clicks", "tags"]
    values, lengths = sparse["values"].numpy(), sparse["lengths"].numpy()
    assert lengths[:2 * n].tolist() == [1] * (2 * n)
    assert values[:n].tolist() == want["city"]
    assert lengths[2 * n:].tolist() == [len(t) for t in want["tags"]]
    assert values[2 * n:].tolist() == [t for row in want["tags"] for t in row]
    # The cross hashes each row's string key (the int64 whose MurmurHash3 is the string's) with its clicks.
    strings = ops.Strings.from_pylist([r[2] for r in ROWS])
    keys = _keys(strings)
    clicks = np.array([int(r[3]) if r[3] else -1 for r in ROWS], dtype=np.int64)
    assert values[n:2 * n].tolist() == ops.cross(keys, clicks, 97, seed=2).tolist()
    assert (ops.murmur3_32(keys[[k for k, r in enumerate(ROWS) if r[2]]], seed=5)
            == ops.murmur3_32(ops.Strings.from_pylist([r[2] for r in ROWS if r[2]]), seed=5)).all()


def _keys(strings) -> np.ndarray:
    """The keys the source keeps for ``strings`` (MISSING_ID -1 for the empty ones)."""
    out = np.empty(len(strings), dtype=np.int64)
    string_keys(strings.offsets, strings.data, 5, out)  # the Categorical's seed: the column's hash seed
    out[np.diff(strings.offsets) == 0] = -1
    return out


@pytest.mark.parametrize("gz", [False, True])
def test_csv_with_header_matches_an_independent_computation(tmp_path, gz):
    """Columns taken by name (declared order differs from the file's; an undeclared quoted column), CRLF line
    ends, a byte order mark, quoted strings with commas and quotes, NaN and empty floats missing."""
    path = write_csv(tmp_path / ("rows.csv.gz" if gz else "rows.csv"), order=(3, 2, 0, 4, 1), gz=gz)
    spec = tabular(SCHEMA, TabularFiles(path, "csv", COLUMNS, header=True))
    check_batch(one_epoch(spec))


def test_tsv_without_header_and_parquet_give_the_same_batches(tmp_path):
    tsv = tmp_path / "rows.tsv"
    tsv.write_text("\n".join("\t".join(r) for r in ROWS) + "\n", encoding="utf-8")
    check_batch(one_epoch(tabular(SCHEMA, TabularFiles(tsv, "tsv", COLUMNS))))
    semi = tmp_path / "rows.txt"
    semi.write_text("\n".join(";".join(r).replace("|", " ") for r in ROWS) + "\n", encoding="utf-8")
    check_batch(one_epoch(tabular(SCHEMA, TabularFiles(semi, "csv", COLUMNS, delimiter=";", list_delimiter=" "))))
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.table({
        "label": [int(r[0]) for r in ROWS], "price": [float(r[1]) if r[1] else None for r in ROWS],
        "city": [r[2] for r in ROWS], "clicks": [int(r[3]) if r[3] else None for r in ROWS],
        "tags": pa.array([[int(t) for t in r[4].split("|")] if r[4] else [] for r in ROWS], pa.list_(pa.int64()))}),
        parquet)
    check_batch(one_epoch(tabular(SCHEMA, TabularFiles(parquet, "parquet", COLUMNS))))


def test_header_must_name_every_column_and_match_across_files(tmp_path):
    good = write_csv(tmp_path / "a.csv")
    other = write_csv(tmp_path / "b.csv", order=(1, 0, 2, 3, 4))
    short = write_csv(tmp_path / "c.csv", order=(0, 1, 2, 4), extra=False)
    with pytest.raises(RowError, match=r"c\.csv:1: the header has no column\(s\) \['clicks'\]"):
        open_source(TabularFiles(short, "csv", COLUMNS, header=True))
    with pytest.raises(RowError, match=r"b\.csv:1: the header .* differs from .*a\.csv's"):
        open_source(TabularFiles([good, other], "csv", COLUMNS, header=True))
    twice = tmp_path / "d.csv"
    twice.write_text("label,label,price,city,clicks,tags\n1,1,2,x,3,4\n")
    with pytest.raises(RowError, match=r"names column\(s\) \['label'\] more than once"):
        open_source(TabularFiles(twice, "csv", COLUMNS, header=True))
    only = tmp_path / "e.csv"
    only.write_text("label,price,city,clicks,tags\n")
    with pytest.raises(DataError, match="e.csv: file is empty"):  # a header and no rows
        open_source(TabularFiles(only, "csv", COLUMNS, header=True))


def test_bad_rows_are_named_by_file_and_line_after_the_header(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("label,price,city,clicks,tags\n1,2.5,x,3,1\n1,abc,x,3,1\n1,inf,x,3,1\n,1,x,3,1\n"
                    '1,1,"open,3,1\n1,1,x,3,1|\n0,1,y,4,2\n')
    spec = tabular(SCHEMA, TabularFiles(path, "csv", COLUMNS, header=True))
    with pytest.raises(DataError) as info:
        list(Loader(spec, batch_size=8, placement="cpu", shuffle=False))
    assert (info.value.file, info.value.line) == (str(path), 3)
    assert str(info.value).endswith("column price (field 2): 'abc' is not a number")
    spec = tabular(SCHEMA, TabularFiles(path, "csv", COLUMNS, header=True, on_error="skip"))
    loader = Loader(spec, batch_size=8, placement="cpu", shuffle=False)
    (batch,) = list(loader)
    assert batch["valid"].tolist() == [True, False, False, False, False, False, True]
    assert [(s.where, s.reason) for s in loader.skipped] == [
        (f"{path}:3", "column price (field 2): 'abc' is not a number"),
        (f"{path}:4", "column price (field 2): 'inf' is not a finite number"),
        (f"{path}:5", "column label (field 1): is empty, and a value is required"),
        (f"{path}:6", "column city (field 3): a quoted field has no closing quote on its line"),
        (f"{path}:7", "column tags (field 5): '1|' is not a list of decimal integers separated by '|'"),
    ]
    assert batch["label"].tolist()[6] == 0.0 and batch["dense"][6].tolist() == [1.0]


def test_floats_are_read_as_python_reads_them(tmp_path):
    texts = ["0.1", "1e23", "2.2250738585072011e-308", "123456789012345678901234567890", "-0.0", "5.",
             ".5", "1_000.25", "+3", "9007199254740993", "4.9e-324"]
    path = tmp_path / "f.tsv"
    path.write_text("".join(f"{k % 2}\t{t}\n" for k, t in enumerate(texts)))
    spec = tabular(Schema("y", (Dense("x", clip_min=None, log1p=False),)),
                   TabularFiles(path, "tsv", (Column("y", K.FLOAT), Column("x", K.FLOAT))))
    source = open_source(spec.source)
    got = source.read(np.arange(len(texts))).columns["x"].values
    assert got.view(np.int64).tolist() == np.array([float(t) for t in texts]).view(np.int64).tolist()


@pytest.mark.parametrize("make, error, field", [
    (lambda: TabularFiles("x", "csv", COLUMNS, header=1), TypeError, "TabularFiles.header"),
    (lambda: TabularFiles("x", "csv", COLUMNS, delimiter=",,"), TypeError, "TabularFiles.delimiter"),
    (lambda: TabularFiles("x", "csv", COLUMNS, delimiter="."), ValueError, "TabularFiles.delimiter"),
    (lambda: TabularFiles("x", "tsv", COLUMNS, list_delimiter="\t"), ValueError, "TabularFiles.list_delimiter"),
    (lambda: TabularFiles("x", "csv", COLUMNS, list_delimiter='"'), ValueError, "TabularFiles.list_delimiter"),
    (lambda: TabularFiles("x.parquet", "parquet", COLUMNS, header=True), ValueError, "TabularFiles.header"),
    (lambda: TabularFiles("x.parquet", "parquet", COLUMNS, delimiter=","), ValueError, "TabularFiles.delimiter"),
    (lambda: TabularFiles("x", "columnar", (Column("s", K.STRING),)), TypeError, "converted tables"),
    (lambda: Column("s", K.STRING, hash_seed=-1), ValueError, "Column.hash_seed"),
    (lambda: tabular(Schema(None, (Dense("city"),)), TabularFiles("x", "csv", COLUMNS)), TypeError, "Dense('city')"),
])
def test_declaration_errors_name_the_field(make, error, field):
    with pytest.raises(error, match=field.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_defaults_and_string_seeds():
    files = TabularFiles("x.csv", "csv", COLUMNS)
    assert (files.delimiter, files.list_delimiter, files.header) == (",", "|", False)
    assert TabularFiles("x.tsv", "tsv", COLUMNS).delimiter == "\t"
    spec = tabular(SCHEMA, files)
    seeds = {c.name: c.hash_seed for c in spec.source.columns}
    assert seeds["city"] == 5 and spec.source.column("label").required
    only_cross = tabular(Schema(None, (Cross("city", "clicks", 10),)), files)
    assert only_cross.source.column("city").hash_seed == 0


def test_a_line_too_long_is_one_bad_row_with_every_block(tmp_path):
    """A line over the length a line may have is one bad row; its chunk still has the float block (a chunk
    without it would not line up with its missing flags)."""
    from feedline.loader.sources.line_index import MAX_LINE_BYTES
    from feedline.loader.sources.text import TextFormat
    path = tmp_path / "long.csv"
    path.write_bytes(b"label,price,city,clicks,tags\n1,2.5,x,1,1\n0," + b"9" * (MAX_LINE_BYTES + 10)
                     + b",y,2,2\n1,3.5,z,3,3\n")
    files = TabularFiles(path, "csv", COLUMNS, header=True, on_error="skip")
    source = TextFormat(files)
    index = source.index(str(path))
    long = int(np.flatnonzero(index.lines == 3)[0])
    chunk = source.load(str(path), index, long)
    assert chunk.bad.tolist() == [True] and "bytes long" in chunk.reasons[0]
    assert chunk.ints.shape == (1, 3) and chunk.floats.shape == (1, 1) and chunk.missing.shape == (1, 4)
    loader = Loader(tabular(SCHEMA, files), batch_size=3, placement="cpu", shuffle=False)
    (batch,) = list(loader)
    assert batch["valid"].tolist() == [True, False, True]
    assert batch["dense"][:, 0].tolist() == [2.5, 0.0, 3.5]
    assert [s.where for s in loader.skipped] == [f"{path}:3"]
