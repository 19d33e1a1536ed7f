"""``on_error`` said in one place for every kind of pipeline: image definitions (``image.train``, ``image.val``,
``image.pipeline``) and the Loader both take it (either is enough; both must agree), and a table takes it where
its files are declared (``criteo``, ``TabularFiles``), with an error naming that place when the Loader's
differs. Each case is checked by what the epoch delivers, not by the attribute alone."""
from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from conftest import write_images
from feedline.loader import DataError, Loader
from feedline.pipelines import image
from feedline.pipelines.criteo import criteo
from feedline.pipelines.tabular import Categorical, Column, Dense, Schema, TabularFiles, tabular

GOOD_IMAGES = 5


@pytest.fixture(scope="module")
def folder_with_a_bad_image(tmp_path_factory):
    root = tmp_path_factory.mktemp("one_bad")
    write_images(root, GOOD_IMAGES, classes=1, seed=4, sizes=[(64, 48)] * GOOD_IMAGES)
    (root / "class_0" / "img_0002.jpg").write_bytes(b"not a jpeg at all")  # index 2 of 5
    return root


IMAGE_DEFINITIONS = {
    "image.train": lambda root, **kw: image.train(root, size=16, output="uint8", **kw),
    "image.val": lambda root, **kw: image.val(root, size=16, output="uint8", **kw),
    "image.pipeline": lambda root, **kw: image.pipeline(root, [image.decode(), image.resize((16, 16))], **kw),
}


def delivered(loader) -> tuple[list[int], list[str]]:
    indices = []
    for batch in loader:
        indices += batch["index"][batch["valid"]].tolist()
    return sorted(indices), [s.where for s in loader.skipped]


@pytest.mark.parametrize("kind", IMAGE_DEFINITIONS)
@pytest.mark.parametrize("defined, given", [("skip", None), (None, "skip"), ("skip", "skip")])
def test_images_skip_where_the_user_says_so(folder_with_a_bad_image, kind, defined, given):
    spec = IMAGE_DEFINITIONS[kind](folder_with_a_bad_image, **({} if defined is None else {"on_error": defined}))
    loader = Loader(spec, batch_size=2, placement="cpu", **({} if given is None else {"on_error": given}))
    indices, skipped = delivered(loader)
    assert indices == [0, 1, 3, 4]
    assert len(skipped) == 1 and skipped[0].endswith("img_0002.jpg")
    assert loader.state_dict()["config"]["on_error"] == "skip"


@pytest.mark.parametrize("kind", IMAGE_DEFINITIONS)
@pytest.mark.parametrize("defined, given", [(None, None), ("raise", None), (None, "raise"), ("raise", "raise")])
def test_images_raise_by_default_and_when_asked(folder_with_a_bad_image, kind, defined, given):
    spec = IMAGE_DEFINITIONS[kind](folder_with_a_bad_image, **({} if defined is None else {"on_error": defined}))
    loader = Loader(spec, batch_size=2, placement="cpu", shuffle=False, **({} if given is None else {"on_error": given}))
    with pytest.raises(DataError, match="img_0002.jpg"):
        list(loader)


@pytest.mark.parametrize("kind", IMAGE_DEFINITIONS)
@pytest.mark.parametrize("defined, given", [("skip", "raise"), ("raise", "skip")])
def test_images_given_two_policies_name_both_places(folder_with_a_bad_image, kind, defined, given):
    spec = IMAGE_DEFINITIONS[kind](folder_with_a_bad_image, on_error=defined)
    with pytest.raises(ValueError, match=rf"Loader\(on_error='{given}'\) differs from on_error='{defined}' given "
                                         rf"where pipeline '{spec.name}' was defined .*one place"):
        Loader(spec, batch_size=2, placement="cpu", on_error=given)


def test_an_image_definition_checks_on_error_and_keeps_it_when_pickled(folder_with_a_bad_image):
    with pytest.raises(ValueError, match=r"on_error must be one of \['raise', 'skip'\], got 'ignore'"):
        image.val(folder_with_a_bad_image, on_error="ignore")
    spec = pickle.loads(pickle.dumps(image.val(folder_with_a_bad_image, size=16, on_error="skip")))
    assert spec.on_error.value == "skip" and spec.default_shuffle is False


# Tables: a bad row (line 3, a non-numeric I1) among four.
CRITEO_ROWS = ["1\t5" + "\t1" * 12 + "\tab" * 26, "0\t7" + "\t2" * 12 + "\tcd" * 26,
               "1\tx" + "\t3" * 12 + "\tef" * 26, "0\t9" + "\t4" * 12 + "\t12" * 26]


@pytest.fixture(scope="module")
def table_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("one_bad_row")
    (folder / "criteo.tsv").write_text("\n".join(CRITEO_ROWS) + "\n")
    (folder / "own.csv").write_text("y,price,shop\n1,2.5,a\n0,oops,b\n1,4,c\n0,,d\n")
    return folder


def own_table(folder, **files):
    columns = [Column("y", "int"), Column("price", "float"), Column("shop", "string")]
    return tabular(Schema("y", [Dense("price"), Categorical("shop", 10)]),
                   TabularFiles(folder / "own.csv", "csv", columns, header=True, **files))


TABLES = {"criteo": lambda folder, **kw: criteo(folder / "criteo.tsv", table_sizes=10, **kw),
          "tabular": own_table}
# where the bad row is, and its row index (with a header, the first row is line 2)
BAD_ROW = {"criteo": ("criteo.tsv:3", 2), "tabular": ("own.csv:3", 1)}


@pytest.mark.parametrize("kind", TABLES)
@pytest.mark.parametrize("given", [None, "skip"])
def test_tables_skip_where_their_files_are_declared(table_files, kind, given):
    loader = Loader(TABLES[kind](table_files, on_error="skip"), batch_size=4, placement="cpu", shuffle=False,
                    **({} if given is None else {"on_error": given}))
    (batch,) = list(loader)
    where, row = BAD_ROW[kind]
    assert batch["index"].tolist() == [0, 1, 2, 3]
    assert batch["valid"].tolist() == [i != row for i in range(4)]  # the bad row stays in its place, invalid
    assert [s.where for s in loader.skipped] == [str(table_files / where)]


@pytest.mark.parametrize("kind", TABLES)
@pytest.mark.parametrize("given", [None, "raise"])
def test_tables_raise_by_default(table_files, kind, given):
    loader = Loader(TABLES[kind](table_files), batch_size=4, placement="cpu", shuffle=False,
                    **({} if given is None else {"on_error": given}))
    with pytest.raises(DataError, match=BAD_ROW[kind][0]):
        list(loader)


@pytest.mark.parametrize("kind", TABLES)
def test_a_loader_skip_over_tables_says_where_to_give_it(table_files, kind):
    spec = TABLES[kind](table_files)
    with pytest.raises(ValueError, match=rf"Loader\(on_error='skip'\) differs from on_error='raise' of the files "
                                         rf"of pipeline '{spec.name}'.*criteo\(\.\.\., on_error='skip'\) or "
                                         rf"TabularFiles\(\.\.\., on_error='skip'\)"):
        Loader(spec, batch_size=4, placement="cpu", on_error="skip")
    with pytest.raises(ValueError, match=r"on_error='raise' of the files"):
        Loader(TABLES[kind](table_files, on_error="raise"), batch_size=4, placement="cpu", on_error="skip")


def test_a_table_definition_that_contradicts_its_files_is_refused(table_files):
    spec = dataclasses.replace(criteo(table_files / "criteo.tsv"), on_error="skip")
    with pytest.raises(ValueError, match=r"on_error='skip' given where pipeline 'criteo' was defined .* differs "
                                         r"from on_error='raise' of the files"):
        Loader(spec, batch_size=4, placement="cpu")


def test_valid_masks_the_skipped_image_slot(folder_with_a_bad_image):
    loader = Loader(image.val(folder_with_a_bad_image, size=16, output="uint8", on_error="skip"), batch_size=5,
                    placement="cpu")
    (batch,) = list(loader)
    assert batch["valid"].tolist() == [True, True, True, True, False]  # filled from the next good: padding last
    assert torch.equal(batch["index"], torch.tensor([0, 1, 3, 4, -1]))
