"""``feedline bench --pipeline criteo --baseline torchrec|pyarrow``: feedline against what recommendation engineers
already run, on the same TSV, batch size (8192) and table size, each side in a process of its own.

``torchrec`` sides: ``torchrec`` (TorchRec's conversion, then its in-memory DLRM data path:
:mod:`feedline.benchmarks.torchrec_baseline`), ``feedline_converted`` (``feedline convert criteo``, then
``Loader(criteo(folder, table_sizes=...), placement="cpu")``) and ``feedline_tsv`` (the Loader straight from
the TSV). ``pyarrow`` sides: ``feedline_tsv``, ``pyarrow_parse`` and ``pyarrow_numpy``
(:mod:`feedline.benchmarks.pyarrow_baseline`). feedline shuffles rows (seed 0) and hashes with MurmurHash3 in
every epoch.

How it is measured: first, the numba kernels feedline's sides will run are compiled where numba's disk cache
lacks them, in a process of its own over a sample of the TSV (:mod:`feedline.benchmarks.kernel_warmup`: a new
install's one-time compile is not timed; the sides load the kernels from the cache inside their timing). The TSV
is read through once (so every side finds it in the page cache); the two conversions
run as commands of their own (``convert_s`` is the command's own time, ``convert_peak_rss_mb`` its peak memory).
Then every side starts in its own process (imports untimed) and, in turn, opens its data and takes one whole
epoch (``open_s``, ``first_batch_s``, ``first_epoch_rows_per_s``, all from before opening); then ``rounds``
alternating rounds (A B C A B C ...), each after a pause of ``settle_s``, each about one epoch of batches after
taking the largest read-ahead untimed; ``steady_rows_per_s`` is a side's median round. ``peak_rss_mb`` is each
process's own peak (``rss_after_imports_mb``: the same process before it opened anything).
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from ..loader.devices import available_cores
from . import kernel_warmup, pyarrow_baseline, torchrec_baseline
from .criteo_bench import cached_note
from .criteo_readers import TABLE_SIZE
from .gil_share import gil_keys, py_spy, record_gil
from .peak_memory import run_module
from .side_process import SideProcess
from .trainer import ROUND_OVER_READAHEAD

BASELINES = ("torchrec", "pyarrow")
# The readers whose numba kernels are compiled before anything is timed (kernel_warmup), per baseline: every
# side that runs feedline's kernels (pyarrow_numpy hashes with ops.hash_buckets), the conversion included.
WARMED = {"torchrec": ("feedline_tsv", "feedline_converted"), "pyarrow": ("feedline_tsv", "pyarrow_numpy")}
SETTLE_S = 0.5
GIL_SECONDS = 3
_HERE = "feedline.benchmarks"
# feedline's own modules that opening a Criteo TSV or converted folder imports (the rest come with the Loader):
# imported before the clock starts, as every side's library is (tests/test_bench_baselines checks the list).
FEEDLINE_MODULES = tuple(f"feedline.loader.sources.{name}" for name in (
    "cached_chunks", "columnar", "growing_index", "gzip_stream", "index_store", "line_index", "prepared",
    "table_cache", "text", "text_parse", "text_syntax", "tsv")) + tuple(f"feedline.ops.{name}" for name in (
    "_numba", "_gather_numba", "_jagged_numba", "_murmur3_numba", "_normalize_numba", "_rows_numba",
    "_sequence_numba"))
OPENERS = {
    "torchrec": (f"{_HERE}.torchrec_baseline:open_torchrec", ("torch.utils.data", "torchrec.datasets.criteo")),
    "feedline_converted": (f"{_HERE}.criteo_readers:open_feedline", ("numba", *FEEDLINE_MODULES)),
    "feedline_tsv": (f"{_HERE}.criteo_readers:open_feedline", ("numba", *FEEDLINE_MODULES)),
    "pyarrow_parse": (f"{_HERE}.pyarrow_baseline:open_parse", ()),
    "pyarrow_numpy": (f"{_HERE}.pyarrow_baseline:open_numpy", ()),
}
COMMON_NOTES = (
    "each side runs in a process of its own: peak_rss_mb is its own peak (rss_after_imports_mb: the same process "
    "before opening anything, torch included); library imports are not timed, their work is (torch and TorchRec; "
    "pyarrow; for feedline torch, numba and its own modules, FEEDLINE_MODULES: its compiled kernels load from "
    "numba's cache, with the numba modules they need, inside the timed opening)",
    "first_epoch_rows_per_s: one epoch's rows over the seconds from before opening to its last batch in hand; "
    "steady_rows_per_s: the median of alternating rounds of about one epoch each; convert_s: the conversion "
    "command's own seconds (first_epoch_with_convert adds them)",
    "the TSV is read through once before anything is timed: every side reads it from the page cache",
    "feedline_tsv parses the text every epoch (cache='off'); by default the epochs after the first read the "
    "chunks it converted as it parsed them (python -m feedline.benchmarks.table_cache_bench)",
)

PYARROW_RATIO_NOTES = (
    "tsv_first_epoch_vs_pyarrow_parse: feedline's first epoch, its opening included, over pyarrow's STEADY parse "
    "rate (the stricter ratio: pyarrow's own first parse is slower, its start-up included); "
    "tsv_first_epoch_vs_pyarrow_parse_first_epoch: first epoch over pyarrow's first parse",
)


def bench_criteo_baseline(path: str | os.PathLike, baseline: str, *, batch_size: int = 8192,
                          table_size: int = TABLE_SIZE, rounds: int = 5, settle_s: float | None = None,
                          scratch: str | os.PathLike | None = None, gil_profile: str | os.PathLike | None = None,
                          progress: bool = True) -> dict:
    """Measure feedline against ``baseline`` (``"torchrec"`` or ``"pyarrow"``) on the Criteo TSV at ``path``.
    ``scratch``: where the conversions are written (a temporary folder in it, removed after; None: the system's
    temporary folder). ``gil_profile``: a folder to also sample each side's GIL share for ``GIL_SECONDS`` with
    py-spy, keeping the raw stacks there (``SIDE.gil.txt``). ``settle_s``: the pause before each turn (None:
    ``SETTLE_S``)."""
    settle_s = SETTLE_S if settle_s is None else settle_s
    path = _check(path, baseline, batch_size, table_size, rounds, settle_s, scratch, gil_profile)
    sides = (["torchrec", "feedline_converted", "feedline_tsv"] if baseline == "torchrec"
             else ["feedline_tsv", "pyarrow_parse", "pyarrow_numpy"])
    result = {"pipeline": "criteo", "baseline": baseline, "data": path, "data_bytes": os.path.getsize(path),
              "batch_size": batch_size, "table_size": table_size, "placement": "cpu", "cores": available_cores(),
              "rounds": rounds, "settle_s": settle_s, "sides": sides}
    steps = (3 if baseline == "torchrec" else 1) + len(sides) * (2 + rounds + (gil_profile is not None))
    with tempfile.TemporaryDirectory(prefix="feedline-bench-", dir=scratch) as work, \
            tqdm(total=steps, desc="bench criteo", unit="step", disable=not progress) as bar:
        def step(what: str) -> None:
            bar.set_description(f"bench criteo: {what}")

        # What a new install compiles once (feedline's readers of every side, the conversion included), compiled
        # in a process of its own before any clock starts: the sides load it from numba's cache in their timing.
        step("compiling kernels")
        result.update(kernel_warmup.warm_kernels(path, WARMED[baseline], batch_size=batch_size,
                                                 table_size=table_size, placement="cpu"))
        bar.update()
        _read_through(path)
        data = {side: path for side in sides}
        if baseline == "torchrec":
            data.update(_convert(path, Path(work), result, step, bar))
        processes = {side: _start(side, data[side], batch_size, table_size) for side in sides}
        try:
            for side, process in processes.items():
                step(f"starting {side}")
                result[f"{side}_rss_after_imports_mb"] = process.wait_ready()["rss_after_imports_mb"]
            first = {}
            for side, process in processes.items():
                step(f"{side}, first epoch")
                time.sleep(settle_s)
                first[side] = process.first_epoch()
                bar.update()
            result["rows"] = _same_rows(first)
            plan = _rounds_plan(first)
            result["batches_per_round"] = {side: p[0] for side, p in plan.items()}
            result["untimed_batches_per_round"] = {side: p[1] for side, p in plan.items()}
            runs: dict[str, list[dict]] = {side: [] for side in sides}
            for r in range(rounds):
                for side, process in processes.items():
                    step(f"round {r + 1}/{rounds}, {side}")
                    time.sleep(settle_s)
                    runs[side].append(process.round(*plan[side]))
                    bar.update()
            gil = _gil(processes, Path(gil_profile), step, bar) if gil_profile is not None else {}
            closed = {}
            for side, process in processes.items():
                closed[side] = process.close()
                bar.update()
        finally:
            for process in processes.values():
                process.kill()
    result.update(_compiled_in_timing(closed))
    for side in sides:
        result.update(_side_keys(side, first[side], runs[side], closed[side], gil.get(side), batch_size))
        if f"{side}_convert_s" in result:
            result[f"{side}_first_epoch_with_convert_rows_per_s"] = result["rows"] / (
                result[f"{side}_convert_s"] + first[side]["seconds"])
    result.update(_ratios(result, baseline))
    result["notes"] = _notes(baseline, result["rows"], first["feedline_tsv"]["facts"]["shuffle_buffer"])
    result["notes"].append(kernel_warmup.note(result))
    return result


def _compiled_in_timing(closed: dict[str, dict]) -> dict:
    """``kernels_compiled_in_timing``: the numba compiles of every side's process after its imports (all of it
    timed), summed; with any, ``kernels_compiled_in_timing_by_side`` and their names."""
    counts = {side: c["kernels_compiled_in_timing"] for side, c in closed.items()}
    keys = {"kernels_compiled_in_timing": sum(counts.values())}
    if keys["kernels_compiled_in_timing"]:
        keys["kernels_compiled_in_timing_by_side"] = counts
        keys["kernels_compiled_in_timing_names"] = sorted({n for c in closed.values()
                                                           for n in c.get("kernels_compiled_in_timing_names", ())})
    return keys


def _check(path, baseline, batch_size, table_size, rounds, settle_s, scratch, gil_profile) -> str:
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {', '.join(BASELINES)}, got {baseline!r}")
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"--baseline {baseline} compares on a Criteo TSV file; {path!r} is not a file")
    lower = path.lower()
    if lower.endswith((".parquet", ".pq")):
        raise ValueError(f"--baseline {baseline} compares on a Criteo TSV file, got Parquet {path!r}")
    if baseline == "torchrec" and lower.endswith(".gz"):
        raise ValueError(f"TorchRec's tsv_to_npys reads plain TSV; decompress {path!r} first")
    for name, value in (("batch_size", batch_size), ("table_size", table_size), ("rounds", rounds)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(settle_s, bool) or not isinstance(settle_s, (int, float)) or not 0 <= settle_s < 60:
        raise ValueError(f"settle_s must be a number of seconds in [0, 60), got {settle_s!r}")
    if scratch is not None and not os.path.isdir(scratch):
        raise ValueError(f"scratch folder {os.fspath(scratch)!r} does not exist")
    if gil_profile is not None:
        py_spy()
        os.makedirs(gil_profile, exist_ok=True)
    return path


def _read_through(path: str, block: int = 8 << 20) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(block):
            pass


def _convert(path: str, work: Path, result: dict, step, bar) -> dict[str, str]:
    """Both conversions, each a command of its own; their keys go into ``result``; returns each side's data."""
    commands = {
        "feedline_converted": ("feedline.cli", ["convert", "criteo", path, "--out", work / "feedline",
                                                "--no-progress", "--json"]),
        "torchrec": (f"{_HERE}.torchrec_baseline", [path, work / "torchrec"]),
    }
    for side, (module, args) in commands.items():
        step(f"{side}, conversion")
        report = work / f"{side}.json"
        done = run_module(module, args + [report], report)
        result[f"{side}_convert_s"] = done["seconds"]
        result[f"{side}_convert_process_s"] = done["process_s"]
        result[f"{side}_convert_peak_rss_mb"] = done["peak_rss_mb"]
        result[f"{side}_convert_bytes"] = done["bytes_out"]
        bar.update()
    return {"feedline_converted": str(work / "feedline"), "torchrec": str(work / "torchrec")}


def _start(side: str, data: str, batch_size: int, table_size: int) -> SideProcess:
    opener, imports = OPENERS[side]
    if side == "pyarrow_parse":
        kwargs = {"path": data}
    else:
        kwargs = {"folder" if side == "torchrec" else "path": data, "batch_size": batch_size,
                  "table_size": table_size}
    return SideProcess(side, opener, kwargs, imports=imports)


def _same_rows(first: dict[str, dict]) -> int:
    rows = {side: f["rows"] for side, f in first.items()}
    if len(set(rows.values())) != 1:
        raise RuntimeError(f"the sides delivered different numbers of rows in their first epoch: {rows}")
    return next(iter(rows.values()))


def _rounds_plan(first: dict[str, dict]) -> dict[str, tuple[int, int]]:
    """Per side (timed batches, untimed batches): the largest read-ahead is taken untimed first (never a whole
    epoch: a side whose epoch is one table takes none), then at least an epoch's batches, and at least
    ``ROUND_OVER_READAHEAD`` times the untimed ones."""
    readahead = max(f["readahead"] for f in first.values())
    plan = {}
    for side, f in first.items():
        untimed = min(readahead, f["batches"] - 1)
        plan[side] = (max(f["batches"], ROUND_OVER_READAHEAD * untimed), untimed)
    return plan


def _gil(processes: dict[str, SideProcess], folder: Path, step, bar) -> dict[str, dict]:
    """Each side in turn takes batches while py-spy samples its GIL."""
    shares = {}
    for side, process in processes.items():
        step(f"{side}, GIL share")
        process.busy(GIL_SECONDS + 2.0)
        time.sleep(0.5)  # sampling starts once batches flow and ends before they stop
        try:
            shares[side] = record_gil(process.pid, GIL_SECONDS, folder / f"{side}.gil.txt")
        finally:
            process.busy_done()
        bar.update()
    return shares


def _side_keys(side: str, first: dict, runs: list[dict], closed: dict, gil: dict | None, batch_size: int) -> dict:
    rates = [r["samples_per_s"] for r in runs]
    keys = {f"{side}_open_s": first["open_s"], f"{side}_first_batch_s": first["first_batch_s"],
            f"{side}_first_epoch_rows_per_s": first["rows"] / first["seconds"],
            f"{side}_steady_rows_per_s": statistics.median(rates),
            f"{side}_steady_rows_per_s_per_round": [round(r) for r in rates],
            f"{side}_peak_rss_mb": closed["peak_rss_mb"],
            f"{side}_peak_rss_after_first_epoch_mb": first["peak_rss_after_first_epoch_mb"]}
    if gil is not None:  # (the share, and the GIL's milliseconds per batch at the steady rate, per thread kind)
        keys.update(gil_keys(side, gil, keys[f"{side}_steady_rows_per_s"], batch_size))
    return keys


def _ratios(result: dict, baseline: str) -> dict:
    def ratio(a: str, b: str) -> float:
        return result[a] / result[b]

    if baseline == "torchrec":
        return {
            "converted_vs_torchrec_steady": ratio("feedline_converted_steady_rows_per_s", "torchrec_steady_rows_per_s"),
            "converted_vs_torchrec_first_epoch_with_convert": ratio(
                "feedline_converted_first_epoch_with_convert_rows_per_s",
                "torchrec_first_epoch_with_convert_rows_per_s"),
            "tsv_vs_torchrec_first_epoch_with_convert": ratio("feedline_tsv_first_epoch_rows_per_s",
                                                              "torchrec_first_epoch_with_convert_rows_per_s"),
            "tsv_vs_torchrec_steady": ratio("feedline_tsv_steady_rows_per_s", "torchrec_steady_rows_per_s"),
            "convert_speedup": ratio("torchrec_convert_s", "feedline_converted_convert_s"),
        }
    return {
        "tsv_first_epoch_vs_pyarrow_parse": ratio("feedline_tsv_first_epoch_rows_per_s",
                                                  "pyarrow_parse_steady_rows_per_s"),
        "tsv_first_epoch_vs_pyarrow_parse_first_epoch": ratio("feedline_tsv_first_epoch_rows_per_s",
                                                              "pyarrow_parse_first_epoch_rows_per_s"),
        "tsv_steady_vs_pyarrow_parse": ratio("feedline_tsv_steady_rows_per_s", "pyarrow_parse_steady_rows_per_s"),
        "tsv_first_epoch_vs_pyarrow_numpy": ratio("feedline_tsv_first_epoch_rows_per_s",
                                                  "pyarrow_numpy_first_epoch_rows_per_s"),
        "tsv_steady_vs_pyarrow_numpy": ratio("feedline_tsv_steady_rows_per_s", "pyarrow_numpy_steady_rows_per_s"),
    }


def _notes(baseline: str, rows: int, shuffle_buffer: int) -> list[str]:
    notes = list(COMMON_NOTES)
    notes += torchrec_baseline.NOTES if baseline == "torchrec" else pyarrow_baseline.NOTES + PYARROW_RATIO_NOTES
    cached = cached_note("feedline_tsv", rows, shuffle_buffer)
    if cached:
        notes.append(cached + "; its steady rate is a cached rate: use a larger file to measure parsing")
    return notes
