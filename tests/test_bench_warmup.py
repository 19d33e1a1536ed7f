"""The benchmarks compile feedline's numba kernels before any clock starts, in a process of their own over a
sample of the data (``benchmarks/kernel_warmup.py``), so that a new install's one-time compile is not timed."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from feedline.benchmarks import criteo_bench, kernel_warmup, mix_bench, numba_compiles, placement_bench, remote_bench
from feedline.cli.command import main
from feedline.datagen.synthetic_criteo import make_criteo


@pytest.fixture(scope="module")
def tsv(tmp_path_factory):
    path = tmp_path_factory.mktemp("warmup") / "day.tsv"
    make_criteo(path, 3000, seed=0)
    return path


@pytest.fixture(scope="module")
def other_tsv(tmp_path_factory):
    path = tmp_path_factory.mktemp("warmup") / "other.tsv"
    make_criteo(path, 2000, seed=1)
    return path


def test_a_sample_is_the_first_rows_in_the_same_format(tsv, tmp_path):
    lines = tsv.read_bytes().splitlines(keepends=True)
    sample = kernel_warmup.sample_of(str(tsv), str(tmp_path / "a"), 100)
    assert os.path.basename(sample) == "day.tsv" and open(sample, "rb").read() == b"".join(lines[:100])
    packed = tmp_path / "day.tsv.gz"
    packed.write_bytes(gzip.compress(tsv.read_bytes()))
    sample = kernel_warmup.sample_of(str(packed), str(tmp_path / "b"), 7)
    assert sample.endswith("day.tsv.gz") and gzip.open(sample).read() == b"".join(lines[:7])
    table = pa.table({"label": list(range(50)), "I1": [float(i) for i in range(50)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=10)
    sample = kernel_warmup.sample_of(str(tmp_path / "t.parquet"), str(tmp_path / "c"), 25)
    assert pq.read_table(sample).equals(table.slice(0, 25))
    assert pq.ParquetFile(sample).metadata.row_group(0).num_rows == 10  # row groups as the data's
    assert kernel_warmup.sample_of(str(tmp_path), str(tmp_path / "d"), 5) is None  # a folder: read itself


def test_the_note_names_the_count_in_timing_only_where_it_is_reported():
    keys = {"kernel_warmup_readers": ["loader_cache_on"]}
    assert "kernels_compiled_in_timing counts" in kernel_warmup.note({**keys, "kernels_compiled_in_timing": 0})
    assert "kernels_compiled_in_timing" not in kernel_warmup.note(keys)


def test_unknown_readers_are_refused(tsv):
    with pytest.raises(ValueError, match="readers must be some of"):
        kernel_warmup.warm_kernels(tsv, ("loader_cache_on", "pandas"), batch_size=8, table_size=10)
    with pytest.raises(ValueError, match="readers must be some of"):
        kernel_warmup.warm_kernels(tsv, (), batch_size=8, table_size=10)


def test_the_criteo_bench_warms_the_kernels_before_its_clock_starts(tsv, monkeypatch):
    events = []
    monkeypatch.setattr(kernel_warmup, "warm_kernels", lambda path, readers, **kw: events.append(
        ("warm", os.fspath(path), readers, kw["batch_size"])) or {"kernel_compile_s": 0.0, "kernels_compiled": 0,
                                                                  "kernel_warmup_s": 0.0,
                                                                  "kernel_warmup_readers": list(readers)})
    opened = criteo_bench.open_loader
    monkeypatch.setattr(criteo_bench, "open_loader", lambda *a, **kw: events.append(("open",)) or opened(*a, **kw))
    result = criteo_bench.bench_criteo(tsv, batch_size=256, batches=2, baseline=False, progress=False)
    assert events == [("warm", str(tsv), ("loader_cache_on", "loader_cache_off"), 256), ("open",)]
    assert result["kernels_compiled_in_timing"] == 0 and result["kernel_warmup_readers"] == [
        "loader_cache_on", "loader_cache_off"]
    assert any(note.startswith("kernel warm-up: ") for note in result["notes"])
    assert "kernel_compile_s" not in criteo_bench.bench_criteo(tsv, batch_size=256, batches=2, baseline=False,
                                                               progress=False, warm_kernels=False)


def test_compiles_are_counted_by_function_and_loads_are_not():
    numba = pytest.importorskip("numba")
    before = numba_compiles.compiled_kernels()

    # a function of feedline's own namespace, compiled here (no cache): one signature, then a second
    kernel_warmup._probe = numba.njit(lambda x: x + 1)
    try:
        kernel_warmup._probe(1)
        kernel_warmup._probe(1)
        assert numba_compiles.compiled_since(before) == {
            "kernels_compiled_in_timing": 1,
            "kernels_compiled_in_timing_names": [f"{__name__}.{test_compiles_are_counted_by_function_and_loads_are_not.__name__}"
                                                 ".<locals>.<lambda>"]}
        kernel_warmup._probe(1.5)
        assert numba_compiles.compiled_since(before)["kernels_compiled_in_timing"] == 2
    finally:
        del kernel_warmup._probe
    assert numba_compiles.compiled_since(numba_compiles.compiled_kernels()) == {"kernels_compiled_in_timing": 0}


@pytest.mark.slow
def test_on_a_fresh_cache_the_warm_up_compiles_and_the_timed_run_only_loads(tsv, tmp_path):
    """A new install's first bench: the warm-up process fills an empty numba cache, and the timed process
    compiles nothing (its kernels load from the cache). A second run finds everything cached."""
    cache = tmp_path / "numba-cache"
    cache.mkdir()
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}

    def bench(name: str) -> dict:
        out = tmp_path / name
        subprocess.run([sys.executable, "-m", "feedline.cli", "bench", "--pipeline", "criteo", "--data", str(tsv),
                        "--batch-size", "512", "--batches", "3", "--baseline", "none", "--no-progress",
                        "--json", str(out)], env=env, check=True, capture_output=True, cwd=tmp_path)
        return json.loads(out.read_text())

    first = bench("first.json")
    assert first["kernels_compiled"] > 10 and first["kernel_compile_s"] > 0
    assert any(name.endswith(".nbi") for _, _, names in os.walk(cache) for name in names)
    assert first["kernels_compiled_in_timing"] == 0
    again = bench("again.json")
    assert again["kernels_compiled"] == 0 and again["kernel_compile_s"] == 0
    assert again["kernels_compiled_in_timing"] == 0


def test_a_script_without_a_main_guard_is_told_what_to_do(tsv, tmp_path):
    """A script calling the bench at its top level: the warm-up's spawned process imports it again and dies; the
    error says where the fix is instead of multiprocessing's BrokenProcessPool alone."""
    script = tmp_path / "my_bench.py"
    script.write_text("from feedline.benchmarks import kernel_warmup\n"
                      f"kernel_warmup.warm_kernels({str(tsv)!r}, ('loader_cache_on',), batch_size=8, table_size=10)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode != 0
    assert "BrokenProcessPool" in done.stderr and 'if __name__ == "__main__":' in done.stderr


@pytest.fixture
def recorded(monkeypatch):
    """The warm-up and the placement and mix benches replaced by recorders (in the order they ran); the fake bench
    compiles a numba function of feedline's namespace, as a compile left inside the timing would."""
    numba = pytest.importorskip("numba")
    events = []

    def warm(path, readers, **kw):
        events.append(("warm", path, readers, kw.get("placement", "cpu"), kw.get("last_batch", "partial"),
                       kw["batch_size"]))
        return {"kernel_compile_s": 1.5, "kernels_compiled": 7, "kernel_warmup_s": 2.0,
                "kernel_warmup_readers": list(readers)}

    def bench(name):
        def timed(*args, **kw):
            events.append((name,))
            kernel_warmup._probe = numba.njit(lambda x: x + 2)
            kernel_warmup._probe(1)
            return {"pipeline": name}
        return timed

    monkeypatch.setattr(kernel_warmup, "warm_kernels", warm)
    monkeypatch.setattr(placement_bench, "bench_placements", bench("placements"))
    monkeypatch.setattr(mix_bench, "bench_mix", bench("mix"))
    monkeypatch.setattr(remote_bench, "bench_remote", bench("remote"))
    yield events
    vars(kernel_warmup).pop("_probe", None)


def _bench_json(tmp_path, *args) -> dict:
    out = tmp_path / "bench.json"
    assert main(["bench", *args, "--batch-size", "64", "--no-progress", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def _warmed_keys(result: dict) -> None:
    assert {k: result[k] for k in ("kernel_compile_s", "kernels_compiled", "kernel_warmup_s")} == {
        "kernel_compile_s": 1.5, "kernels_compiled": 7, "kernel_warmup_s": 2.0}
    assert result["kernel_warmup_readers"] == ["loader_cache_on", "loader_cache_off"]
    assert result["kernels_compiled_in_timing"] == 1  # the bench's own compile, counted in its process
    assert [n for n in result["notes"] if n.startswith("kernel warm-up: ")]


def test_placement_auto_warms_what_the_auto_loader_reads_before_its_clock_starts(recorded, tsv, tmp_path):
    result = _bench_json(tmp_path, "--pipeline", "criteo", "--data", str(tsv), "--placement", "auto")
    assert recorded == [("warm", str(tsv), ("loader_cache_on", "loader_cache_off"), "auto", "drop", 64),
                        ("placements",)]
    _warmed_keys(result)


def test_a_criteo_mix_warms_each_of_its_tables_and_its_single_source_first(recorded, tsv, other_tsv, tmp_path):
    result = _bench_json(tmp_path, "--pipeline", "criteo", "--mix", f"a={tsv}", f"b={other_tsv}:2", "--data",
                         str(tsv))
    assert recorded == [("warm", [str(tsv), str(other_tsv), str(tsv)], ("loader_cache_on", "loader_cache_off"),
                         "cpu", "drop", 64), ("mix",)]
    _warmed_keys(result)


def test_remote_workers_warm_the_local_loaders_and_leave_the_workers_compiles_uncounted(recorded, tsv, tmp_path):
    result = _bench_json(tmp_path, "--pipeline", "criteo", "--data", str(tsv), "--remote-workers", "1")
    assert recorded == [("warm", str(tsv), ("loader_cache_on", "loader_cache_off"), "cpu", "drop", 64),
                        ("remote",)]
    assert "kernels_compiled_in_timing" not in result and result["kernels_compiled"] == 7
    assert [n for n in result["notes"] if "remote workers' compiles are not counted" in n]


def test_an_image_mix_runs_no_warm_up(recorded, tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    result = _bench_json(tmp_path, "--pipeline", "image-train", "--mix", f"a={tmp_path / 'a'}", f"b={tmp_path / 'b'}")
    assert recorded == [("mix",)] and result == {"pipeline": "mix"}


def test_a_bad_row_met_in_the_warm_up_names_the_users_file_and_line(tsv, tmp_path, capsys):
    lines = tsv.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"".join(lines[:50]) + b"1\t2\t3\n" + b"".join(lines[50:70]))
    assert main(["bench", "--pipeline", "criteo", "--mix", f"a={tsv}", f"b={bad}", "--batch-size", "64",
                 "--batches", "2", "--rounds", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "the kernel warm-up" in err and f"RowError: {bad}:51: expected 40 tab-separated fields, found 3" in err
    assert "feedline-kernel-warmup-" not in err  # not the sample's temporary path


@pytest.mark.slow
@pytest.mark.parametrize("command", ["auto", "mix"])
def test_on_a_fresh_cache_placement_auto_and_a_mix_compile_nothing_in_their_timing(command, tsv, other_tsv,
                                                                                   tmp_path):
    """A new install's first `feedline bench --placement auto` (the auto Loader's profile and run, the static
    placements) and `--mix` (each source's own runner): the warm-up fills an empty numba cache with every kernel
    their timed process runs."""
    cache = tmp_path / "numba-cache"
    cache.mkdir()
    out = tmp_path / "bench.json"
    what = (["--data", str(tsv), "--placement", "auto", "--batches", "4", "--rounds", "2"] if command == "auto" else
            ["--mix", f"a={tsv}", f"b={other_tsv}:2", "--batches", "4", "--rounds", "1"])
    # the placement bench's rounds with no pause before each turn (up to 8 rounds of 3 contenders: 24 s of pauses)
    command_line = ("import sys; from feedline.benchmarks import placement_bench; placement_bench.SETTLE_S = 0.0; "
                    "from feedline.cli.command import main; sys.exit(main(sys.argv[1:]))")
    subprocess.run([sys.executable, "-c", command_line, "bench", "--pipeline", "criteo", *what, "--batch-size", "256",
                    "--no-progress", "--json", str(out)], env={**os.environ, "NUMBA_CACHE_DIR": str(cache)},
                   check=True, capture_output=True, cwd=tmp_path)
    result = json.loads(out.read_text())
    assert result["kernels_compiled"] > 10 and result["kernel_compile_s"] > 0
    assert result["kernels_compiled_in_timing"] == 0
    assert result["kernel_warmup_readers"] == ["loader_cache_on", "loader_cache_off"]
