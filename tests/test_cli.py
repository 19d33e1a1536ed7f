"""The feedline command: bad flags get a clear message and exit status 2; the commands run end to end."""
import json

import pytest

from feedline.loader.cli import main


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
