"""Streamed tables: exact length, every row once per epoch over lists and globs of TSV, gzip and Parquet files,
the two-level shuffle (its order and its quality), ranks by chunks, a cached index, and a cache that never
holds more than it may."""
import gzip

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader import DataError, Loader
from feedline.loader.sources import chunked, open_source
from feedline.loader.sources import tsv as tsv_module
from feedline.pipelines.criteo import criteo

from save_restore import check_save_restore


def valid_indices(loader, epochs=1):
    out = []
    for _ in range(epochs):
        for batch in loader:
            valid = batch.get("valid", torch.ones(len(batch["index"]), dtype=torch.bool))
            out += batch["index"][valid].tolist()
    return out


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    """Three 'days' of 7000 rows: plain TSV, gzip TSV, and Parquet with row groups of 1500."""
    folder = tmp_path_factory.mktemp("days")
    make_criteo(folder / "day_0.tsv", 7000, seed=0)
    make_criteo(folder / "day_1.tsv", 7000, seed=1)
    with open(folder / "day_1.tsv", "rb") as f, gzip.open(folder / "day_1.tsv.gz", "wb") as g:
        g.write(f.read())
    make_criteo(folder / "day_2.parquet", 7000, seed=2, format="parquet")
    table = pq.read_table(folder / "day_2.parquet")
    pq.write_table(table, folder / "day_2.parquet", row_group_size=1500)
    return folder


@pytest.mark.parametrize("files,rows", [(["day_0.tsv"], 7000), (["day_0.tsv", "day_1.tsv.gz"], 14000),
                                        (["day_2.parquet"], 7000), (["day_*.tsv"], 14000)])
def test_every_row_once_per_epoch_and_an_exact_length(days, files, rows):
    paths = [str(days / f) for f in files]
    spec = criteo(paths if len(paths) > 1 else paths[0])
    loader = Loader(spec, batch_size=512, placement="cpu", seed=4, shuffle_buffer=3000)
    assert len(loader.source) == rows
    assert len(loader) == -(-rows // 512)
    for _ in range(2):
        batches = list(loader)
        assert len(batches) == len(loader)
        seen = [i for b in batches for i in b["index"].tolist()]
        assert sorted(seen) == list(range(rows))


def test_a_row_is_numbered_by_its_file_and_line(days):
    """Row i of the data set is line i+1 of the first file, then the next file's lines, and its values are
    that line's."""
    loader = Loader(criteo([str(days / "day_0.tsv"), str(days / "day_1.tsv.gz")], table_sizes=1 << 30), batch_size=1000,
                    placement="cpu", shuffle=False)
    first = next(iter(loader))
    lines = (days / "day_0.tsv").read_text().splitlines()
    assert first["index"].tolist() == list(range(1000))
    labels = [float(line.split("\t")[0]) for line in lines[:1000]]
    assert first["label"].tolist() == labels
    assert loader.source.where(7003) == f"{days / 'day_1.tsv.gz'}:4"


def test_shuffle_false_gives_the_files_order(days):
    loader = Loader(criteo(str(days / "day_0.tsv")), batch_size=700, placement="cpu", shuffle=False)
    assert valid_indices(loader) == list(range(7000))


def test_the_order_is_a_pure_function_of_seed_and_epoch(days):
    spec = criteo(str(days / "day_0.tsv"))
    a = Loader(spec, batch_size=500, placement="cpu", seed=9, shuffle_buffer=2000)
    b = Loader(spec, batch_size=500, placement="cpu", seed=9, shuffle_buffer=2000)
    c = Loader(spec, batch_size=500, placement="cpu", seed=10, shuffle_buffer=2000)
    first = valid_indices(a)
    assert first == valid_indices(b) and first != valid_indices(c)
    assert valid_indices(a) != first  # the next epoch is shuffled anew


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def test_shuffle_quality_at_the_defaults(tmp_path):
    """At the default chunk size and shuffle buffer, the delivery position says almost nothing about the
    position in the file: |Spearman rho| < 0.1 over 200,000 rows (a file order gives 1); and rows that are
    neighbours in the file are far apart in the delivery."""
    make_criteo(tmp_path / "day.tsv", 200_000, seed=5)
    loader = Loader(criteo(tmp_path / "day.tsv"), batch_size=8192, placement="cpu", seed=1)
    delivered = np.array(valid_indices(loader))
    position = np.empty_like(delivered)
    position[delivered] = np.arange(delivered.size)
    assert abs(spearman(delivered, np.arange(delivered.size))) < 0.1
    gaps = np.abs(np.diff(position))  # where consecutive file rows land
    assert np.median(gaps) > 10_000


@pytest.mark.parametrize("policy", ["partial", "pad", "drop"])
def test_ranks_split_by_chunks_and_step_together(days, policy):
    spec = criteo([str(days / "day_0.tsv"), str(days / "day_1.tsv.gz")])
    per_rank, seen = [], []
    for rank in range(3):
        loader = Loader(spec, batch_size=400, placement="cpu", seed=2, rank=rank, world_size=3, last_batch=policy)
        batches = list(loader)
        per_rank.append(len(batches))
        assert len(batches) == len(loader)
        for b in batches:
            valid = b.get("valid", torch.ones(len(b["index"]), dtype=torch.bool))
            seen += b["index"][valid].tolist()
    assert len(set(per_rank)) == 1
    assert len(seen) == len(set(seen))
    if policy == "drop":
        assert len(seen) == 3 * ((14000 // 3) // 400 * 400)
    else:
        assert sorted(seen) == list(range(14000))


def test_gzip_and_multi_group_parquet_resume_exactly(days):
    check_save_restore(lambda: Loader(criteo(str(days / "day_1.tsv.gz")), batch_size=900, placement="cpu", seed=3,
                                      shuffle_buffer=2500))
    check_save_restore(lambda: Loader(criteo(str(days / "day_2.parquet")), batch_size=900, placement="cpu", seed=3,
                                      shuffle_buffer=2500, rank=1, world_size=2, last_batch="pad"))


def test_the_line_index_is_kept_beside_the_file_and_reused(tmp_path, monkeypatch):
    path = tmp_path / "day.tsv"
    make_criteo(path, 3000, seed=0)
    first = open_source(criteo(path).source)
    assert (tmp_path / ".day.tsv.feedline-lines").exists()  # hidden: a glob over the folder never matches it

    def no_scan(*args):
        raise AssertionError("the file was indexed again")

    monkeypatch.setattr(tsv_module, "_scan", no_scan)
    again = open_source(criteo(path).source)
    assert np.array_equal(again.chunk_rows, first.chunk_rows) and again.num_rows == 3000
    with open(path, "a") as f:
        f.write(path.read_text().splitlines()[0] + "\n")  # the file changed: its index must be rebuilt
    with pytest.raises(AssertionError, match="indexed again"):
        open_source(criteo(path).source)


def test_the_cache_never_holds_more_than_its_rows(tmp_path):
    make_criteo(tmp_path / "day.tsv", 100_000, seed=0)
    loader = Loader(criteo(tmp_path / "day.tsv"), batch_size=1000, placement="cpu", shuffle_buffer=4000)
    source = loader.source
    largest = int(source.chunk_rows.max())
    held = []
    for _ in loader:
        held.append(sum(int(source.chunk_rows[c]) for c in list(source._cache)))
    # two buffer-fulls and the chunks straddling them and warmed ahead
    assert source.cache_rows == 2 * 4000 + chunked.CHUNKS_BEYOND * largest
    assert max(held) <= source.cache_rows + largest
    assert source.cache_rows < 100_000 // 2


def test_a_bad_line_deep_in_a_large_file(tmp_path):
    path = tmp_path / "day.tsv"
    make_criteo(path, 50_000, seed=0)
    lines = path.read_text().splitlines()
    lines[41_234] = "\t".join(lines[41_234].split("\t")[:-2])  # two fields short, line 41,235
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=f"^{path}:41235: expected 40 tab-separated fields, found 38"):
        list(Loader(criteo(path), batch_size=4096, placement="cpu", shuffle=False))
    loader = Loader(criteo(path, on_error="skip"), batch_size=4096, placement="cpu", seed=1)
    seen = valid_indices(loader)
    assert sorted(seen) == [i for i in range(50_000) if i != 41_234]
    assert [s.where for s in loader.skipped] == [f"{path}:41235"]


def test_shuffle_buffer_is_for_tables(days, image_dir):
    from feedline.pipelines import image

    with pytest.raises(ValueError, match="shuffle_buffer applies to tabular sources"):
        Loader(image.val(image_dir), batch_size=4, shuffle_buffer=100)
    with pytest.raises(ValueError, match="shuffle_buffer must be a positive number of rows"):
        Loader(criteo(str(days / "day_0.tsv")), batch_size=4, shuffle_buffer=0)


def test_convert_writes_a_table_that_reads_back_the_same_rows(tmp_path):
    from feedline.cli import main

    path = tmp_path / "day.tsv"
    make_criteo(path, 5000, seed=3)
    lines = path.read_text().splitlines()
    lines[1234] = "not\ta\tcriteo\tline"
    path.write_text("\n".join(lines) + "\n")
    assert main(["convert", "criteo", str(path), "--out", str(tmp_path / "strict"), "--no-progress"]) == 2
    assert main(["convert", "criteo", str(path), "--out", str(tmp_path / "pq"), "--on-error", "skip",
                 "--no-progress"]) == 0
    assert (tmp_path / "pq" / "skipped.tsv").read_text().startswith(f"{path}:1235\texpected 40")
    text = Loader(criteo(path, on_error="skip"), batch_size=1000, placement="cpu", shuffle=False)
    converted = Loader(criteo(tmp_path / "pq"), batch_size=1000, placement="cpu", shuffle=False)
    assert len(converted.source) == 4999
    a = [b for b in text]
    b = [b for b in converted]
    keep = torch.cat([x["valid"] if "valid" in x else torch.ones(len(x["index"]), dtype=torch.bool) for x in a])
    for key in ("label", "dense"):
        assert torch.equal(torch.cat([x[key] for x in a])[keep], torch.cat([x[key] for x in b]))
    ids_a = torch.cat([x["sparse"]["values"].reshape(26, -1).T for x in a])[keep]
    ids_b = torch.cat([x["sparse"]["values"].reshape(26, -1).T for x in b])
    assert torch.equal(ids_a, ids_b)
    assert main(["convert", "criteo", str(path), "--out", str(tmp_path / "pq"), "--no-progress"]) == 2  # not empty


def test_a_converted_table_streams_resumes_and_shards_like_the_text(tmp_path):
    from feedline.loader.sources.text_to_columnar import convert

    make_criteo(tmp_path / "a.tsv", 9000, seed=1)
    make_criteo(tmp_path / "b.tsv", 4000, seed=2)
    text = criteo([str(tmp_path / "a.tsv"), str(tmp_path / "b.tsv")])
    convert(text.source, tmp_path / "conv")
    converted = criteo(tmp_path / "conv")
    a = Loader(text, batch_size=1000, placement="cpu", shuffle=False)
    b = Loader(converted, batch_size=1000, placement="cpu", shuffle=False)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x["index"], y["index"]) and torch.equal(x["dense"], y["dense"])
        assert torch.equal(x["sparse"]["values"], y["sparse"]["values"]) and torch.equal(x["label"], y["label"])
    check_save_restore(lambda: Loader(converted, batch_size=700, placement="cpu", seed=5, rank=1, world_size=2,
                                      shuffle_buffer=3000))
    (tmp_path / "conv" / "records.bin").write_bytes(b"short")
    with pytest.raises(DataError, match="records.bin: is missing or not"):
        open_source(converted.source)
