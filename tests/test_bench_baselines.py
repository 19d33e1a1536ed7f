"""The Criteo baselines of `feedline bench --baseline torchrec|pyarrow` and the machinery that runs them: what each
baseline delivers (checked against feedline's Loader and against the file's text), the child processes' memory
and errors, the GIL sampler, and the whole comparison through the CLI at tiny sizes (its arithmetic, never its
speed)."""
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pytest
import torch

from feedline.benchmarks import criteo_compare, gil_share, pyarrow_baseline
from feedline.datagen.synthetic_criteo import make_criteo
from feedline.benchmarks.peak_memory import run_module
from feedline.loader import Loader
from feedline.cli import main
from feedline.pipelines.criteo import criteo

ROWS = 3000
TABLE = 1_000_003


@pytest.fixture(scope="module")
def tsv(tmp_path_factory):
    path = tmp_path_factory.mktemp("baselines") / "day.tsv"
    make_criteo(path, ROWS, seed=2)
    return path


def file_fields(path) -> list[list[str]]:
    return [line.rstrip("\n").split("\t") for line in open(path)]


def test_pyarrow_numpy_delivers_exactly_what_feedline_delivers(tsv):
    ours = next(pyarrow_baseline.epoch_batches(tsv, ROWS, TABLE, seed=0, epoch=0, shuffle=False))
    loader = Loader(criteo(str(tsv), table_sizes=TABLE), ROWS, placement="cpu", shuffle=False)
    try:
        theirs = next(iter(loader))
    finally:
        loader.close()
    for key in ("label", "dense", "index"):
        assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key
    assert list(ours["sparse"]["keys"]) == list(theirs["sparse"]["keys"])
    for key in ("values", "lengths", "offsets"):
        a, b = ours["sparse"][key], theirs["sparse"][key]
        assert a.dtype == b.dtype and torch.equal(a, b), key


def test_pyarrow_numpy_epochs_are_permutations_of_every_row(tsv):
    seen = []
    for epoch in (0, 1):
        batches = list(pyarrow_baseline.epoch_batches(tsv, 1024, TABLE, seed=0, epoch=epoch))
        assert [len(b["label"]) for b in batches] == [1024, 1024, ROWS - 2048]
        index = torch.cat([b["index"] for b in batches]).numpy()
        assert sorted(index) == list(range(ROWS))
        seen.append(index)
    assert not np.array_equal(seen[0], seen[1]) and not np.array_equal(seen[0], np.arange(ROWS))


def test_a_feedline_side_imports_its_modules_before_its_clock_starts(tsv):
    """The bench imports feedline's own modules untimed (``FEEDLINE_MODULES``), as it does every side's library:
    opening the TSV and taking an epoch then imports no other feedline module (one imported lazily joins the list)."""
    code = ("import importlib, sys\n"
            "from feedline.benchmarks import criteo_compare as cc, criteo_readers\n"
            "for name in cc.OPENERS['feedline_tsv'][1]:\n"
            "    importlib.import_module(name)\n"
            "before = set(sys.modules)\n"
            f"opened = criteo_readers.open_feedline(path={str(tsv)!r}, batch_size=1024, table_size={TABLE})\n"
            "rows = sum(len(batch['label']) for batch in opened.make())\n"
            "opened.close()\n"
            "print(rows, sorted(m for m in set(sys.modules) - before if m.startswith('feedline')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(" ", 1) == [str(ROWS), "[]\n"]


def test_hex_ids_decode_as_python_reads_them_over_chunks_and_slices():
    rng = np.random.default_rng(0)
    texts = [("" if rng.random() < 0.2 else format(int(rng.integers(0, 2 ** 60)), "x")[: int(rng.integers(1, 16))])
             for _ in range(500)]
    texts[3], texts[4] = "ABCdef01", "0"
    whole = pa.array(texts, type=pa.string())
    column = pa.chunked_array([whole.slice(0, 123), whole.slice(123, 1), whole.slice(124, 0), whole.slice(124)])
    decoded = pyarrow_baseline.decode_hex(column, "C7")
    assert decoded.tolist() == [int(t, 16) if t else -1 for t in texts]


@pytest.mark.parametrize("text,words", [("12g4", "row 2: '12g4' is not a hexadecimal id"),
                                        ("1" * 16, "row 2: an id of 16 hexadecimal digits")])
def test_a_bad_hex_id_names_its_column_and_row(text, words):
    column = pa.chunked_array([pa.array(["a1"]), pa.array(["ff", text])])
    with pytest.raises(ValueError, match=words) as info:
        pyarrow_baseline.decode_hex(column, "C9")
    assert str(info.value).startswith("C9: ")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Local function is not supported by pickle")  # inside TorchRec's conversion
def test_torchrec_reads_every_row_once_in_file_order_batches(tsv, tmp_path):
    torchrec_baseline = pytest.importorskip("feedline.benchmarks.torchrec_baseline")
    pytest.importorskip("torchrec")
    summary = torchrec_baseline.convert(tsv, tmp_path / "npy")
    assert summary["seconds"] > 0 and summary["bytes_out"] > ROWS * 39 * 4
    fields = file_fields(tsv)
    expected_ids = np.array([[int(f or "0", 16) % TABLE for f in row[14:]] for row in fields])
    expected_labels = np.array([int(row[0]) for row in fields])
    opened = torchrec_baseline.open_torchrec(str(tmp_path / "npy"), 1024, TABLE)
    orders = []
    for _ in range(2):
        batches = list(opened.make())
        assert [len(labels) for labels, _ in batches] == [1024, 1024, ROWS - 2048]
        for k, (labels, batch) in enumerate(batches):
            rows = slice(1024 * k, 1024 * (k + 1))
            kjt = batch.sparse_features
            ids = kjt.values().view(26, -1).T.numpy()  # key-major, one id per row and key
            # the batch holds exactly the rows of its slice of the file, in some order (shuffle_batches)
            assert sorted(map(tuple, ids)) == sorted(map(tuple, expected_ids[rows]))
            assert sorted(labels.tolist()) == sorted(expected_labels[rows].tolist())
            assert kjt.keys() == [f"cat_{j}" for j in range(26)] and batch.dense_features.shape == (len(labels), 13)
        orders.append(torch.cat([b.sparse_features.values().view(26, -1)[0] for _, b in batches]))
    assert not torch.equal(orders[0], orders[1])  # rows move inside their batches from one epoch to the next


def test_a_command_reports_its_own_peak_memory_and_its_errors(tmp_path):
    report = tmp_path / "r.json"
    (tmp_path / "grow.py").write_text("import json, sys\nb = bytearray(300 << 20)\n"
                                      "json.dump({'seconds': 1.5, 'args': sys.argv[1:]}, open(sys.argv[-1], 'w'))\n")
    done = run_module("grow", ["a", report], report, cwd=str(tmp_path))
    assert done["seconds"] == 1.5 and done["args"] == ["a", str(report)] and done["process_s"] > 0
    # its own 300 MiB and an interpreter, never this (larger) process's memory, which ru_maxrss would give
    assert 300 <= done["peak_rss_mb"] < 300 + 200
    (tmp_path / "fail.py").write_text("import sys\nprint('the reason', file=sys.stderr)\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match="exit status 3") as info:
        run_module("fail", [], report, cwd=str(tmp_path))
    assert "the reason" in str(info.value)


def test_gil_samples_are_the_counts_of_a_raw_file(tmp_path):
    raw = tmp_path / "gil.txt"
    raw.write_text("main (a.py:1);f (a.py:2) 7\n\nworker (b.py:3) 5\n")
    assert gil_share.gil_samples(raw) == 12


def test_gil_samples_by_thread_kind(tmp_path):
    """Stacks recorded with thread frames (``--threads``) counted per kind of thread, by the names feedline gives its
    batch thread and feature workers; a stack without a thread frame, or of another thread, is ``other``."""
    raw = tmp_path / "gil.txt"
    raw.write_text("thread (11): feedline-features_0;_work (p.py:9) 4\n"
                   "thread (12): feedline-features_1;_work (p.py:9) 3\n"
                   "thread (13): feedline-batches;_run (b.py:1) 2\n"
                   "thread (10): MainThread;<module> (x.py:1);f (x.py:2) 6\n"
                   "thread (14): pin_memory;loop (t.py:5) 1\n"
                   "main (a.py:1) 5\n")
    assert gil_share.gil_samples_by_thread(raw) == {"workers": 7, "batch": 2, "main": 6, "other": 6}
    assert gil_share.gil_samples(raw) == 21


def test_gil_keys_give_milliseconds_per_batch_per_thread_kind():
    """At 500 batches a second (2 ms each), a share of 0.25 is 0.5 ms of GIL per batch, split as its threads hold it."""
    gil = {"gil_share": 0.25, "gil_share_by_thread": {"batch": 0.05, "workers": 0.2}}
    keys = gil_share.gil_keys("feedline_tsv", gil, rows_per_s=500 * 8192, batch_size=8192)
    assert keys["feedline_tsv_gil_share"] == 0.25
    assert keys["feedline_tsv_gil_ms_per_batch"] == pytest.approx(0.5)
    assert keys["feedline_tsv_gil_ms_per_batch_by_thread"] == pytest.approx({"batch": 0.1, "workers": 0.4})
    assert keys["feedline_tsv_gil_share_by_thread"] == {"batch": 0.05, "workers": 0.2}


def test_gil_share_of_a_spinning_and_a_sleeping_process(tmp_path):
    try:
        gil_share.py_spy()
    except ValueError:
        pytest.skip("py-spy is not installed")
    shares = {}
    # (py-spy names a thread where the process imported ``threading``, as every Loader does)
    spin = "import threading\nwhile True: sum(range(1000))"
    for name, body in (("spin", spin), ("sleep", "import time; time.sleep(60)")):
        child = subprocess.Popen([sys.executable, "-c", body])
        try:
            time.sleep(1.0)
            try:
                shares[name] = gil_share.record_gil(child.pid, 1, tmp_path / f"{name}.txt")
            except RuntimeError as exc:
                pytest.skip(f"py-spy cannot attach here: {exc}")
        finally:
            child.kill()
            child.wait()
    assert shares["spin"]["gil_share"] > 0.5 and shares["sleep"]["gil_share"] < 0.2
    assert shares["spin"]["gil_share_by_thread"]["main"] == shares["spin"]["gil_share"]  # (one thread spins)


def bench(tmp_path, argv) -> dict:
    out = tmp_path / "bench.json"
    assert main(["bench", "--pipeline", "criteo", *argv, "--no-progress", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def check_side(result: dict, side: str) -> None:
    for key in ("open_s", "first_batch_s", "first_epoch_rows_per_s", "steady_rows_per_s", "peak_rss_mb",
                "rss_after_imports_mb"):
        assert result[f"{side}_{key}"] > 0, f"{side}_{key}"
    assert result[f"{side}_first_batch_s"] >= result[f"{side}_open_s"]
    assert result[f"{side}_peak_rss_mb"] >= result[f"{side}_rss_after_imports_mb"]
    per_round = result[f"{side}_steady_rows_per_s_per_round"]
    assert len(per_round) == result["rounds"]
    assert math.isclose(result[f"{side}_steady_rows_per_s"], float(np.median(per_round)), rel_tol=1e-3)


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(criteo_compare, "SETTLE_S", 0.0)


@pytest.mark.slow
def test_pyarrow_comparison_through_the_cli(tsv, tmp_path, quick, kernels_warmed_once):
    result = bench(tmp_path, ["--data", str(tsv), "--baseline", "pyarrow", "--batch-size", "512", "--rounds", "2"])
    assert result["sides"] == ["feedline_tsv", "pyarrow_parse", "pyarrow_numpy"]
    assert result["rows"] == ROWS and result["batch_size"] == 512 and result["table_size"] == TABLE
    assert result["data_bytes"] == os.path.getsize(tsv)
    for side in result["sides"]:
        check_side(result, side)
    # parse only takes a whole table per round; the batch sides an epoch of batches after the read-ahead
    assert result["batches_per_round"]["pyarrow_parse"] == 1
    assert result["untimed_batches_per_round"]["pyarrow_parse"] == 0
    assert result["batches_per_round"]["feedline_tsv"] >= math.ceil(ROWS / 512)
    assert math.isclose(result["tsv_first_epoch_vs_pyarrow_parse"], result["feedline_tsv_first_epoch_rows_per_s"]
                        / result["pyarrow_parse_steady_rows_per_s"])
    assert math.isclose(result["tsv_first_epoch_vs_pyarrow_parse_first_epoch"],
                        result["feedline_tsv_first_epoch_rows_per_s"] / result["pyarrow_parse_first_epoch_rows_per_s"])
    assert math.isclose(result["tsv_steady_vs_pyarrow_numpy"], result["feedline_tsv_steady_rows_per_s"]
                        / result["pyarrow_numpy_steady_rows_per_s"])
    assert any("over pyarrow's STEADY parse rate" in note for note in result["notes"])
    assert any("chunk cache" in note for note in result["notes"])  # 3,000 rows stay parsed after epoch one
    assert not any(k.startswith("torchrec") or k.endswith("_convert_s") for k in result)


@pytest.mark.slow
def test_torchrec_comparison_through_the_cli(tsv, tmp_path, quick, kernels_warmed_once):
    pytest.importorskip("torchrec")
    result = bench(tmp_path, ["--data", str(tsv), "--baseline", "torchrec", "--batch-size", "1024", "--rounds", "1",
                              "--scratch", str(tmp_path)])
    assert result["sides"] == ["torchrec", "feedline_converted", "feedline_tsv"] and result["rows"] == ROWS
    for side in result["sides"]:
        check_side(result, side)
    for side in ("torchrec", "feedline_converted"):
        assert 0 < result[f"{side}_convert_s"] < result[f"{side}_convert_process_s"]
        assert result[f"{side}_convert_peak_rss_mb"] > 0 and result[f"{side}_convert_bytes"] > 0
        assert math.isclose(result[f"{side}_first_epoch_with_convert_rows_per_s"], ROWS / (
            result[f"{side}_convert_s"] + ROWS / result[f"{side}_first_epoch_rows_per_s"]))
    assert math.isclose(result["converted_vs_torchrec_steady"], result["feedline_converted_steady_rows_per_s"]
                        / result["torchrec_steady_rows_per_s"])
    assert math.isclose(result["convert_speedup"],
                        result["torchrec_convert_s"] / result["feedline_converted_convert_s"])
    assert any("inside each batch" in note for note in result["notes"])
    assert os.listdir(tmp_path) == ["bench.json"]  # the conversions' temporary folder is gone


@pytest.mark.parametrize("argv,message", [
    (["--baseline", "torchrec", "--placement", "gpu"], "--baseline torchrec compares CPU loaders"),
    (["--baseline", "pyarrow", "--trainer-step-ms", "auto"], "--baseline pyarrow times whole epochs"),
    (["--baseline", "pyarrow", "--batches", "3"], "--baseline pyarrow times whole epochs"),
    (["--baseline", "pandas", "--gil-profile", "x"], "--scratch and --gil-profile apply to --baseline torchrec"),
    (["--baseline", "torchrec", "--scratch", "/no/such/folder"], "'/no/such/folder' is not an existing folder"),
])
def test_bad_baseline_flags_are_named(tsv, argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", "--pipeline", "criteo", "--data", str(tsv), *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_image_pipelines_take_no_criteo_baseline(image_dir, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--pipeline", "image-val", "--data", str(image_dir), "--baseline", "torchrec"])
    assert "--baseline torchrec applies to --pipeline criteo" in capsys.readouterr().err


@pytest.mark.parametrize("name,message", [("day.parquet", "got Parquet"), ("day.tsv.gz", "decompress")])
def test_torchrec_needs_plain_tsv(tmp_path, name, message, capsys):
    (tmp_path / name).write_bytes(b"x")
    assert main(["bench", "--pipeline", "criteo", "--data", str(tmp_path / name), "--baseline", "torchrec"]) == 2
    assert message in capsys.readouterr().err
