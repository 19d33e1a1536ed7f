"""Declaring tabular pipelines: every schema field is checked, the stages and placements are as declared."""
import pytest

from feedline.loader.sources import open_source

from feedline.pipelines.criteo import criteo
from feedline.pipelines.stage import Backend
from feedline.pipelines.tabular import (Categorical, Column, ColumnKind, Cross, Dense, FileFormat, MultiHot,
                                        OnError, Schema, TabularFiles, tabular)

FILES = TabularFiles("data.parquet", "parquet", (
    Column("y", ColumnKind.INT), Column("age", ColumnKind.FLOAT), Column("clicks", ColumnKind.INT),
    Column("city", ColumnKind.HEX), Column("shop", ColumnKind.INT), Column("tags", ColumnKind.INT_LIST)))


@pytest.mark.parametrize("make, error, field", [
    (lambda: Dense(""), TypeError, "Dense.name"),
    (lambda: Dense("a", fill="0"), TypeError, "Dense.fill"),
    (lambda: Dense("a", fill=float("nan")), ValueError, "Dense.fill"),
    (lambda: Dense("a", clip_min=True), TypeError, "Dense.clip_min"),
    (lambda: Dense("a", log1p=1), TypeError, "Dense.log1p"),
    (lambda: Dense("a", boundaries=[]), ValueError, "Dense.boundaries"),
    (lambda: Dense("a", boundaries=[1, 1]), ValueError, "Dense.boundaries"),
    (lambda: Dense("a", boundaries="12"), TypeError, "Dense.boundaries"),
    (lambda: Dense("a", boundaries=[0, float("inf")]), ValueError, "Dense.boundaries"),
    (lambda: Categorical("a", 0), ValueError, "Categorical.num_buckets"),
    (lambda: Categorical("a", 2**32 + 1), ValueError, "Categorical.num_buckets"),
    (lambda: Categorical("a", 10.0), TypeError, "Categorical.num_buckets"),
    (lambda: Categorical("a", 10, seed=-1), ValueError, "Categorical.seed"),
    (lambda: Categorical(3, 10), TypeError, "Categorical.name"),
    (lambda: MultiHot("a", 10, max_len=0), ValueError, "MultiHot.max_len"),
    (lambda: MultiHot("a", True), TypeError, "MultiHot.num_buckets"),
    (lambda: Cross("a", "a", 10), ValueError, "Cross.a and Cross.b"),
    (lambda: Cross("a", None, 10), TypeError, "Cross.b"),
    (lambda: Schema("y", ()), TypeError, "Schema.features"),
    (lambda: Schema("y", (Dense("a"), "b")), TypeError, "Schema.features"),
    (lambda: Schema("y", (Dense("a"), Categorical("a", 3))), ValueError, "names repeat"),
    (lambda: Schema("a", (Dense("a"),)), ValueError, "Schema.label"),
    (lambda: TabularFiles([], "tsv", (Column("a", "int"),)), TypeError, "TabularFiles.paths"),
    (lambda: TabularFiles("x", "xlsx", (Column("a", "int"),)), ValueError, "TabularFiles.format"),
    (lambda: TabularFiles("x", "tsv", (Column("a", "int"),), on_error="warn"), ValueError, "on_error"),
    (lambda: TabularFiles("x", "tsv", ()), TypeError, "TabularFiles.columns"),
    (lambda: TabularFiles("x", "columnar", (Column("a", "float"),)), TypeError, "converted tables hold only int and hex"),
    (lambda: TabularFiles("x", "tsv", (Column("a", "int"), Column("a", "hex"))), ValueError, "names repeat"),
    (lambda: Column("a", "varchar"), ValueError, "Column.kind"),
    (lambda: Column("a", "int", required=1), TypeError, "Column.required"),
    (lambda: criteo("x.tsv", table_sizes=[10] * 25), ValueError, "26 sizes"),
    (lambda: criteo("x.tsv", table_sizes=[10] * 25 + [0]), ValueError, "C26"),
    (lambda: criteo("x.tsv", table_sizes="big"), TypeError, "table_sizes"),
    (lambda: criteo(None), TypeError, "paths"),
])
def test_fields_are_validated_by_name(make, error, field):
    with pytest.raises(error, match=field.replace("(", r"\(").replace(".", r"\.")):
        make()


@pytest.mark.parametrize("feature, error, message", [
    (Dense("nowhere"), ValueError, "reads column 'nowhere', which the files do not declare"),
    (Dense("city"), TypeError, "needs column 'city' to be"),
    (Categorical("age", 10), TypeError, "needs column 'age'"),
    (MultiHot("shop", 10), TypeError, "needs column 'shop'"),
    (Cross("city", "tags", 10), TypeError, "needs column 'tags'"),
])
def test_schema_must_fit_the_files(feature, error, message):
    with pytest.raises(error, match=message):
        tabular(Schema("y", (feature,)), FILES)


def test_full_schema_declares_stages_and_placements():
    schema = Schema("y", (Dense("clicks"), Dense("age", clip_min=None, log1p=False, boundaries=(18, 30, 65)),
                          Categorical("city", 1000, seed=1), Cross("city", "shop", 500, seed=2),
                          MultiHot("tags", 100, seed=3, max_len=4)))
    spec = tabular(schema, FILES)
    assert [s.name for s in spec.stages] == ["parse", "dense", "hash", "multi_hot", "assemble"]
    assert spec.stage("parse").backends == frozenset({Backend.CPU})
    assert all(s.backends == frozenset(Backend) for s in spec.stages[1:])
    assert spec.outputs == ("label", "dense", "sparse")
    assert spec.stage("assemble").keys == ("age", "city", "city_x_shop", "tags")  # the schema's order
    assert spec.valid_cuts() == [1, 2, 3, 4, 5]
    for cut in spec.valid_cuts():
        backends = spec.backends_at(cut)
        assert backends["parse"] is Backend.CPU
        assert [backends[s.name] for s in spec.stages] == [Backend.CPU] * cut + [Backend.GPU] * (5 - cut)
    with pytest.raises(ValueError, match="not a valid placement"):
        spec.backends_at(0)
    assert spec.source.column("y").required and not FILES.column("y").required
    assert spec.describe_cut(1) == "gpu" and spec.describe_cut(5) == "cpu"


def test_criteo_spec():
    spec = criteo(["a.tsv.gz", "b.tsv"], table_sizes=100, on_error="skip")
    assert spec.name == "criteo"
    assert [s.name for s in spec.stages] == ["parse", "dense", "hash", "assemble"]
    assert spec.valid_cuts() == [1, 2, 3, 4]
    assert spec.source.format is FileFormat.TSV and spec.source.on_error is OnError.SKIP
    assert spec.source.paths == ("a.tsv.gz", "b.tsv")
    assert spec.source.produces == ("label", *[f"I{i}" for i in range(1, 14)], *[f"C{i}" for i in range(1, 27)])
    assert [seed for _, _, seed in spec.stage("hash").categorical] == list(range(26))
    assert criteo("a.parquet").source.format is FileFormat.PARQUET
    assert spec.cut_from_mapping({"hash": "gpu"}) == 2
    with pytest.raises(ValueError, match="parse"):
        spec.cut_from_mapping({"parse": "gpu"})


def test_specs_are_declarations_only(tmp_path):
    spec = criteo(tmp_path / "not-there-yet.tsv")  # nothing is opened until the data is needed
    with pytest.raises(FileNotFoundError):
        open_source(spec.source)


def test_schema_without_sparse_or_label():
    spec = tabular(Schema(None, (Dense("clicks"),)), FILES)
    assert [s.name for s in spec.stages] == ["parse", "dense"]
    assert spec.outputs == ("dense",)


def test_pipeline_definitions_pickle(tmp_path):
    """A definition is a declaration: it pickles (to ship it to other processes) and opening the copy reads
    the same rows."""
    import pickle

    path = tmp_path / "d.tsv"
    path.write_text("\t".join(["1"] + ["2"] * 13 + ["ab"] * 26) + "\n")
    spec = criteo(path)
    copy = pickle.loads(pickle.dumps(spec))
    assert copy == spec and len(open_source(copy.source)) == 1


def test_bucket_and_seed_limits_are_the_kernels_own():
    """A declaration takes exactly the bucket counts and seeds that the hash kernels take (one definition)."""
    from feedline import ops

    top = ops.MAX_NUM_BUCKETS
    assert Categorical("a", top, seed=ops.MAX_SEED).num_buckets == top
    assert criteo("x.tsv", table_sizes=top) is not None
    ops.hash_buckets([7], top, seed=ops.MAX_SEED)  # and the kernel takes them too
    for make, name in ((lambda: Categorical("a", top + 1), "Categorical.num_buckets"),
                       (lambda: MultiHot("a", top + 1), "MultiHot.num_buckets"),
                       (lambda: Cross("a", "b", top + 1), "Cross.num_buckets"),
                       (lambda: criteo("x.tsv", table_sizes=[10] * 25 + [top + 1]), "table_sizes entry for C26")):
        with pytest.raises(ValueError, match=rf"^{name} must be an integer in \[1, {top}\], got {top + 1}$"):
            make()
    with pytest.raises(ValueError, match=rf"seed must be an integer in \[0, {ops.MAX_SEED}\]"):
        Categorical("a", 10, seed=ops.MAX_SEED + 1)
    with pytest.raises(ValueError, match=r"num_buckets must be in"):
        ops.hash_buckets([7], top + 1)
