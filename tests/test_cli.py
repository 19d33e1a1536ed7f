"""The feedline command: bad flags get a clear message and exit status 2; the commands run end to end."""
import json

import pytest

from feedline.cli import main


@pytest.mark.parametrize("argv,message", [
    (["make-data", "images", "--out", "x", "--count", "0"], "--count: expected a positive integer, got 0"),
    (["make-data", "images", "--out", "x", "--seed", "-1"], "--seed: expected an integer >= 0, got -1"),
    (["make-data", "criteo", "--out", "x", "--format", "csv"], "invalid choice: 'csv'"),
    (["bench", "--pipeline", "image-train", "--data", "/nowhere/at/all"], "'/nowhere/at/all' does not exist"),
    (["bench", "--pipeline", "resnet", "--data", "."], "invalid choice: 'resnet'"),
    (["bench", "--pipeline", "image-train"], "needs --data"),
    (["bench", "--pipeline", "image-train", "--data", ".", "--baseline", "pandas"], "--baseline pandas applies to"),
    (["bench", "--pipeline", "criteo", "--data", ".", "--baseline", "torchvision"], "--baseline torchvision applies"),
    (["bench", "--op", "hash", "--json", "/no/such/folder/out.json"], "folder '/no/such/folder' does not exist"),
    (["plan", "--pipeline", "criteo"], "the following arguments are required: --data"),
    (["bench", "--pipeline", "image-train", "--data", ".", "--cpus-per-worker", "2"], "apply with --remote-workers"),
    (["plan", "--pipeline", "criteo", "--data", ".", "--ray-address", "h:1"], "apply with --remote-workers"),
    (["bench", "--pipeline", "image-train", "--data", ".", "--remote-workers", "1", "--placement", "gpu"],
     "--remote-workers compares the CPU placement"),
    (["bench", "--pipeline", "image-train", "--data", ".", "--remote-workers", "0"], "--remote-workers: expected a "
                                                                                      "positive integer, got 0"),
])
def test_bad_flags_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_errors_from_the_library_are_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["plan", "--pipeline", "image-val", "--data", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("feedline plan: error:") and "no class sub-folders" in err and "Traceback" not in err


def test_make_data_then_plan(tmp_path, capsys):
    out = tmp_path / "imgs"
    assert main(["make-data", "images", "--out", str(out), "--count", "24", "--classes", "2", "--seed", "1"]) == 0
    assert (out / ".feedline-data").exists()
    report = tmp_path / "plan.json"
    assert main(["plan", "--pipeline", "image-train", "--data", str(out), "--batch-size", "8", "--batches", "2",
                 "--json", str(report)]) == 0
    shown = capsys.readouterr().out
    assert "stage" in shown and "decode" in shown and "measured" in shown
    plan = json.loads(report.read_text())
    assert plan["pipeline"] == "image-train" and plan["measured_samples_per_s"] > 0
    assert [s["stage"] for s in plan["stages"]] == ["read", "decode", "random_resized_crop", "horizontal_flip",
                                                    "normalize"]


def test_make_criteo_data(tmp_path):
    out = tmp_path / "c.tsv"
    assert main(["make-data", "criteo", "--out", str(out), "--rows", "500", "--seed", "3"]) == 0
    assert len(out.read_text().splitlines()) == 500


# ---- make-data never replaces what --out holds unless told to ---------------------------------------------------

def image_names(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != ".feedline-data")


def test_make_data_images_refuses_a_folder_that_holds_a_dataset(tmp_path, capsys):
    out = tmp_path / "imgs"
    assert main(["make-data", "images", "--out", str(out), "--count", "6", "--classes", "2"]) == 0
    before = image_names(out)
    assert len(before) == 6
    assert main(["make-data", "images", "--out", str(out), "--count", "2", "--classes", "1"]) == 2
    assert "is not empty; pass --force" in capsys.readouterr().err
    assert image_names(out) == before  # nothing was replaced
    assert main(["make-data", "images", "--out", str(out), "--count", "2", "--classes", "1", "--force"]) == 0
    assert image_names(out) == ["class_000/img_000000.jpg", "class_000/img_000001.jpg"]


def test_make_data_images_force_never_removes_files_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["make-data", "images", "--out", str(out), "--count", "2", "--classes", "1", "--force"]) == 2
    assert "no .feedline-data marker" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "keep me"


def test_make_data_criteo_refuses_an_existing_file(tmp_path, capsys):
    out = tmp_path / "c.tsv"
    out.write_text("precious\n")
    assert main(["make-data", "criteo", "--out", str(out), "--rows", "10"]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert out.read_text() == "precious\n"
    assert main(["make-data", "criteo", "--out", str(out), "--rows", "10", "--force"]) == 0
    assert len(out.read_text().splitlines()) == 10
    assert main(["make-data", "criteo", "--out", str(tmp_path), "--rows", "10", "--force"]) == 2
    assert "is a folder" in capsys.readouterr().err


# ---- plan: progress, and a fixed placement --------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_criteo(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "c.tsv"
    assert main(["make-data", "criteo", "--out", str(out), "--rows", "2000", "--seed", "1"]) == 0
    return out


def test_plan_with_a_fixed_placement_shows_it_and_its_measured_rate(small_criteo, tmp_path, capsys):
    report = tmp_path / "plan.json"
    assert main(["plan", "--pipeline", "criteo", "--data", str(small_criteo), "--placement", "cpu",
                 "--batch-size", "256", "--batches", "3", "--no-progress", "--json", str(report)]) == 0
    captured = capsys.readouterr()
    assert "fixed by --placement cpu" in captured.out and "samples/s" in captured.out
    assert "plan:" not in captured.err  # --no-progress
    plan = json.loads(report.read_text())
    assert plan["measured_samples_per_s"] > 0 and plan["batch_size"] == 256
    assert plan["stages"] and set(plan["stages"].values()) == {"cpu"}
    assert "profile_seconds" not in plan  # nothing was profiled


def test_plan_shows_its_progress(small_criteo, capsys):
    assert main(["plan", "--pipeline", "criteo", "--data", str(small_criteo), "--batch-size", "256",
                 "--batches", "2"]) == 0
    err = capsys.readouterr().err
    assert "plan: profiling and placing" in err or "plan: measuring" in err
    assert "4/4" in err  # profiling, warm-up and the two measured batches


def test_plan_on_a_gpu_without_one_is_an_error(small_criteo, capsys):
    from feedline.loader.devices import gpu_available
    if gpu_available():
        pytest.skip("this machine has a GPU")
    assert main(["plan", "--pipeline", "criteo", "--data", str(small_criteo), "--placement", "gpu",
                 "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith("feedline plan: error:")


# ---- one number format for every table ------------------------------------------------------------------------

def test_every_table_formats_numbers_alike():
    from feedline.cli.tables import format_table
    image = {"feedline_samples_per_s": 1234.567, "fraction_of_bound": 1.0234, "batches": 75,
             "speedup_per_round": [1.0234, 0.99876], "readahead_batches": {"feedline": 2, "baseline": 4}}
    tabular = {"feedline_samples_per_s": 456123.7, "open_s": 0.0031, "rows": 200000, "efficiency": 0.95321,
               "notes": ["first note", "second note"]}
    shown = dict(line.split(None, 1) for line in format_table(image).splitlines())
    assert shown == {"feedline_samples_per_s": "1,235", "fraction_of_bound": "1.02", "batches": "75",
                     "speedup_per_round": "1.02  0.999", "readahead_batches": "feedline 2, baseline 4"}
    lines = format_table(tabular).splitlines()
    assert [line.split(None, 1)[1] for line in lines[:4]] == ["456,124", "0.0031", "200,000", "0.953"]
    assert lines[4:] == ["notes", "  - first note", "  - second note"]


def test_make_data_prints_its_summary_in_the_common_format(tmp_path, capsys):
    assert main(["make-data", "criteo", "--out", str(tmp_path / "c.tsv"), "--rows", "1500"]) == 0
    shown = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert shown["rows"] == "1,500" and "," in shown["bytes"]
