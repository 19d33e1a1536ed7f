"""GPU check: every CuPy kernel of feedline.ops against its NumPy twin, and what this GPU can move.

Run as ``python benchmarks/gpu_check.py`` (from the repository root or with feedline installed).
Needs NumPy and CuPy; PyTorch for host-to-device bandwidth and the tables' GPU placement (every cut of the
Criteo pipeline against the CPU's batches); nvidia-ml-py for NVML readings. numba is optional. DALI is
never imported. Prints one JSON document and exits 0; without a usable GPU the document says
``"gpu": false`` and why.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import platform
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TIME_BUDGET_S = 100.0
START = time.perf_counter()


def import_feedline(subpackage: str) -> types.ModuleType:
    """feedline.<subpackage> as installed, else from this repository (with the packages it imports)."""
    try:
        return importlib.import_module(f"feedline.{subpackage}")
    except ImportError:
        for name in ("pipelines", "ops", "loader", "datagen"):
            if f"feedline.{name}" not in sys.modules:
                load_from_tree(ROOT, name)
        return sys.modules[f"feedline.{subpackage}"]


def scheduler_section(rows: int = 200_000, batch_size: int = 8192) -> dict:
    """The scheduler's measured inputs and decision on this machine, for the Criteo pipeline (which needs no
    DALI): per-stage costs on CPU and GPU, bytes, bandwidth, readings and the chosen placement, as a recorded
    profile that tests can replay."""
    import dataclasses
    import os
    import tempfile

    import torch

    import_feedline("loader")
    from feedline.datagen.synthetic_criteo import make_criteo
    from feedline.loader.placement.auto import AutoPlacement
    from feedline.loader.runners import RunnerConfig, make_runner
    from feedline.loader.sources import open_source
    from feedline.loader.stream_order import StreamOrder
    from feedline.pipelines.criteo import criteo

    from feedline.loader.devices import available_cores

    cores = available_cores()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "criteo.tsv")
        make_criteo(path, rows=rows, seed=0, format="tsv")
        spec = criteo(path)
        source = open_source(spec.source)
        config = RunnerConfig(spec.all_cpu, device, batch_size, num_threads=cores)

        def order(size: int, seed: int):
            return StreamOrder(source.chunk_rows, source.chunk_groups, min(size, len(source)), seed=seed)

        auto = AutoPlacement(spec, config, lambda c: make_runner(spec, source, c), order, cores)
        auto.start()
        report = auto.report()
    return {"pipeline": "criteo", "rows": rows, "batch_size": batch_size, "device": str(device),
            "costs": [dataclasses.asdict(c) for c in auto.profile.costs],
            "source_bytes_per_sample": auto.profile.source_bytes_per_sample,
            "h2d_bytes_per_s": auto.profile.h2d_bytes_per_s, "profile_seconds": auto.profile.seconds,
            "decision": report}


def import_ops() -> types.ModuleType:
    """feedline.ops as installed, else straight from this repository's ``ops/`` folder."""
    try:
        return importlib.import_module("feedline.ops")
    except ImportError:
        return load_from_tree(ROOT, "ops")


def load_from_tree(root: Path, subpackage: str) -> types.ModuleType:
    """Import ``root/<subpackage>`` as ``feedline.<subpackage>`` (the layout pyproject installs)."""
    package = sys.modules.get("feedline")
    if package is None:
        package = types.ModuleType("feedline")
        package.__path__ = []
        sys.modules["feedline"] = package
    name = f"feedline.{subpackage}"
    folder = root / subpackage
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    setattr(package, subpackage, module)
    return module


def gpu_unavailable_reason() -> str | None:
    try:
        import cupy
    except Exception as exc:
        return f"cupy not importable: {exc}"
    try:
        if not cupy.cuda.is_available():
            return "cupy sees no CUDA device"
        cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"CUDA unusable: {exc}"
    return None


def over_budget() -> bool:
    return time.perf_counter() - START > TIME_BUDGET_S


def guarded(fn: Callable[[], dict]) -> dict:
    if over_budget():
        return {"skipped": f"time budget of {TIME_BUDGET_S:.0f} s spent"}
    try:
        return fn()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=4)}


# ---------------------------------------------------------------------------------------------------
# Bit-identity and throughput of each kernel


def mismatches(gpu_result, cpu_result) -> int:
    import cupy

    host = cupy.asnumpy(gpu_result)
    if host.shape != cpu_result.shape or host.dtype != cpu_result.dtype:
        return -1
    unsigned = np.dtype(f"u{host.dtype.itemsize}")
    return int(np.count_nonzero(host.view(unsigned) != np.ascontiguousarray(cpu_result).view(unsigned)))


def gpu_seconds(fn: Callable[[], object], repeats: int = 10) -> float:
    """Median time of ``fn`` on the current stream, measured with CUDA events after one warm-up."""
    import cupy

    fn()
    times = []
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return float(np.median(times))


def kernel_entry(name, gpu_fn, cpu_fn, items: int, bytes_moved: int, copy_bytes_per_s: float) -> dict:
    """Compare outputs (tuples of arrays allowed), then time the GPU function."""
    gpu_out, cpu_out = gpu_fn(), cpu_fn()
    pairs = list(zip(gpu_out, cpu_out)) if isinstance(cpu_out, tuple) else [(gpu_out, cpu_out)]
    bad = [mismatches(g, c) for g, c in pairs]
    seconds = gpu_seconds(gpu_fn)
    gbps = bytes_moved / seconds / 1e9
    return {
        "bit_identical": all(b == 0 for b in bad),
        "mismatches": sum(abs(b) for b in bad),
        "count": items,
        "keys_per_s": round(items / seconds),
        "gb_per_s": round(gbps, 2),
        "fraction_of_copy_bandwidth": round(gbps * 1e9 / copy_bytes_per_s, 3),
    }


def device_copy_bytes_per_s(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written."""
    import cupy

    src = cupy.ones(nbytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    seconds = gpu_seconds(lambda: cupy.copyto(dst, src))
    del src, dst
    return 2 * nbytes / seconds


def kernel_checks(ops, copy_bps: float, scale: float = 1.0) -> dict:
    """Per kernel: bit-identity against NumPy and throughput; ``scale`` shrinks every input size."""
    import cupy

    rng = np.random.default_rng(2024)
    results = {}

    def size(full: int) -> int:
        return max(1000, int(full * scale))

    def run(name, make: Callable[[], tuple]):
        results[name] = guarded(lambda: kernel_entry(name, *make(), copy_bytes_per_s=copy_bps))

    n = size(8_000_000)
    keys64 = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    keys64_d = cupy.asarray(keys64)
    run("murmur3_32_int64", lambda: (lambda: ops.murmur3_32(keys64_d, 42), lambda: ops.murmur3_32(keys64, 42), n, 12 * n))
    run("hash_buckets_int64", lambda: (lambda: ops.hash_buckets(keys64_d, 1_000_003, 7),
                                       lambda: ops.hash_buckets(keys64, 1_000_003, 7), n, 16 * n))
    keys32 = rng.integers(-(2**31), 2**31 - 1, n, dtype=np.int32)
    keys32_d = cupy.asarray(keys32)
    run("hash_buckets_int32", lambda: (lambda: ops.hash_buckets(keys32_d, 1 << 20, 3),
                                       lambda: ops.hash_buckets(keys32, 1 << 20, 3), n, 12 * n))

    lengths = rng.integers(0, 48, size(1_000_000))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    data = rng.integers(0, 256, int(offsets[-1]), dtype=np.uint8)
    strings, strings_d = ops.Strings(offsets, data), ops.Strings(cupy.asarray(offsets), cupy.asarray(data))
    run("hash_buckets_strings", lambda: (lambda: ops.hash_buckets(strings_d, 1_000_003, 11),
                                         lambda: ops.hash_buckets(strings, 1_000_003, 11),
                                         len(strings), data.nbytes + 16 * len(strings)))

    m = size(4_000_000)
    a, b = keys64[:m], rng.integers(-(2**63), 2**63 - 1, m, dtype=np.int64)
    a_d, b_d = keys64_d[:m], cupy.asarray(b)
    run("cross", lambda: (lambda: ops.cross(a_d, b_d, 999_983, 5), lambda: ops.cross(a, b, 999_983, 5), m, 24 * m))

    for dtype in (np.float32, np.float64, np.int64):
        x = (rng.normal(0, 1000, m)).astype(dtype)
        if dtype != np.int64:
            x[::17] = np.nan
        bounds = np.unique(np.abs(rng.normal(0, 1000, 64))).astype(np.float64 if dtype == np.int64 else dtype)
        x_d, bounds_d = cupy.asarray(x), cupy.asarray(bounds)
        run(f"bucketize_{np.dtype(dtype).name}",
            lambda x=x, x_d=x_d, bounds=bounds, bounds_d=bounds_d: (
                lambda: ops.bucketize(x_d, bounds_d), lambda: ops.bucketize(x, bounds), m, (x.itemsize + 8) * m))

    bits = rng.integers(0, 2**32, size(16_000_000), dtype=np.uint64).astype(np.uint32).view(np.float32)
    bits_d = cupy.asarray(bits)
    run("normalize_dense_all_bit_patterns", lambda: (lambda: ops.normalize_dense(bits_d, 0.0, None, True),
                                                     lambda: ops.normalize_dense(bits, 0.0, None, True),
                                                     bits.size, 8 * bits.size))
    dense = (rng.lognormal(0, 4, m) - 1).astype(np.float32)
    dense[::11] = np.nan
    dense_d = cupy.asarray(dense)
    run("normalize_dense_features", lambda: (lambda: ops.normalize_dense(dense_d, -1.0, 0.0, True),
                                             lambda: ops.normalize_dense(dense, -1.0, 0.0, True), m, 8 * m))

    row_lengths = rng.integers(0, 12, size(1_000_000))
    row_offsets = np.concatenate([[0], np.cumsum(row_lengths)]).astype(np.int64)
    values = rng.integers(-(2**63), 2**63 - 1, int(row_offsets[-1]), dtype=np.int64)
    row_offsets_d, values_d = cupy.asarray(row_offsets), cupy.asarray(values)

    def jagged_fields(j):
        return (j.values, j.lengths, j.offsets)

    run("multi_hot_max_len_4", lambda: (
        lambda: jagged_fields(ops.multi_hot(row_offsets_d, values_d, 100_003, 9, 4)),
        lambda: jagged_fields(ops.multi_hot(row_offsets, values, 100_003, 9, 4)),
        values.size, 16 * values.size))

    # A Criteo batch's whole-batch kernels: 26 id columns hashed (and crosses), 13 dense columns normalised.
    rows = size(26 * 8192 * 4) // 26
    ids = rng.integers(-1, 2**32, (26, rows), dtype=np.int64)
    ids_d = cupy.asarray(ids)
    categorical = ops.hash_plan(np.arange(26), [1_000_003] * 13 + [1 << 20] * 13, np.arange(26))
    run("hash_columns_criteo", lambda: (lambda: ops.hash_columns(ids_d, categorical),
                                        lambda: ops.hash_columns(ids, categorical),
                                        ids.size, 16 * ids.size))
    crosses = ops.hash_plan([[0, 1], [2, 3], [25, 4]], [999_983, 1 << 16, 7], [5, 6, 7])
    run("hash_columns_crosses", lambda: (lambda: ops.hash_columns(ids_d, crosses),
                                         lambda: ops.hash_columns(ids, crosses), 3 * rows, 24 * 3 * rows))
    raw = np.floor(rng.lognormal(2, 3, (13, rows))).astype(np.float32)
    raw[rng.random(raw.shape) < 0.2] = np.nan
    raw_d = cupy.asarray(raw)
    dense = ops.dense_plan(range(13), [0.0] * 13, [0.0] * 13, [True] * 13)
    run("normalize_columns_criteo", lambda: (lambda: ops.normalize_columns(raw_d, dense),
                                             lambda: ops.normalize_columns(raw, dense), raw.size, 8 * raw.size))
    return results


def table_placement_section(rows: int = 200_000, batch_size: int = 8192) -> dict:
    """The Criteo pipeline over a converted table under every GPU cut against the CPU placement: batches
    bit-identical, rows/s, what crosses PCIe per row (one pinned buffer per batch) and whether it is pinned."""
    import os
    import tempfile

    import torch

    import_feedline("loader")
    from feedline.datagen.synthetic_criteo import make_criteo
    from feedline.loader.runners import RunnerConfig
    from feedline.loader.runners.feature_runner import FeatureRunner
    from feedline.loader.sources import open_source
    from feedline.loader.sources.text_to_columnar import convert
    from feedline.loader.stream_order import StreamOrder
    from feedline.pipelines.criteo import criteo

    device = torch.device("cuda")
    with tempfile.TemporaryDirectory() as folder:
        make_criteo(os.path.join(folder, "criteo.tsv"), rows=rows, seed=0, format="tsv")
        convert(criteo(os.path.join(folder, "criteo.tsv")).source, os.path.join(folder, "conv"))
        spec = criteo(os.path.join(folder, "conv"), table_sizes=1_000_003)
        source = open_source(spec.source, cache_rows=1 << 17)
        plans = list(StreamOrder(source.chunk_rows, source.chunk_groups, batch_size, seed=1).epoch(0))

        def batches(cut: int) -> tuple[list, float]:
            runner = FeatureRunner(spec, source, RunnerConfig(cut, device, batch_size, num_threads=2))
            started = time.perf_counter()
            out = [{k: (v if not isinstance(v, dict) else {n: t for n, t in v.items() if n != "keys"})
                    for k, v in batch.items()} for batch, _ in runner.batches(iter(plans))]
            torch.cuda.synchronize()
            return out, sum(p.indices.size for p in plans) / (time.perf_counter() - started)

        def same(a: dict, b: dict) -> bool:
            return all(same(a[k], b[k]) if isinstance(a[k], dict) else torch.equal(a[k], b[k]) for k in a)

        reference, cpu_rate = batches(spec.all_cpu)
        result = {"rows": rows, "batch_size": batch_size, "cpu_rows_per_s": round(cpu_rate)}
        for cut in spec.valid_cuts()[:-1]:
            if over_budget():
                result[spec.describe_cut(cut)] = {"skipped": "time budget spent"}
                continue
            got, rate = batches(cut)
            runner = FeatureRunner(spec, source, RunnerConfig(cut, device, batch_size))
            tensor, _ = runner._host_part(plans[0])
            result[spec.describe_cut(cut)] = {
                "bit_identical": len(got) == len(reference) and all(same(a, b) for a, b in zip(got, reference)),
                "rows_per_s": round(rate), "pinned": bool(tensor.is_pinned()),
                "bytes_crossing_per_row": tensor.numel() / plans[0].indices.size}
        return result


# ---------------------------------------------------------------------------------------------------
# Transfers, device and NVML


def host_to_device() -> dict:
    try:
        import torch
    except Exception as exc:
        return {"error": f"torch not importable: {exc}"}
    if not torch.cuda.is_available():
        return {"error": "torch sees no CUDA device"}
    nbytes = 256 << 20
    pageable = torch.ones(nbytes, dtype=torch.uint8)
    pinned = pageable.pin_memory()
    result = {"bytes": nbytes}
    for name, host, non_blocking in (("pageable", pageable, False), ("pinned", pinned, True)):
        best = float("inf")
        for _ in range(5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            host.to("cuda", non_blocking=non_blocking)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        result[f"{name}_gb_per_s"] = round(nbytes / best / 1e9, 2)
    return result


def device_info() -> dict:
    import cupy

    device = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(device.id)
    name = props["name"]
    return {
        "name": name.decode() if isinstance(name, bytes) else name,
        "compute_capability": device.compute_capability,
        "multiprocessors": props["multiProcessorCount"],
        "memory_bytes": props["totalGlobalMem"],
        "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "cupy": cupy.__version__,
    }


def nvml_readings() -> dict:
    try:
        import pynvml
    except Exception as exc:
        return {"available": False, "error": f"pynvml not importable: {exc}"}
    import cupy

    pynvml.nvmlInit()
    try:
        bus_id = cupy.cuda.Device().pci_bus_id
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        utilization = pynvml.nvmlDeviceGetUtilizationRates(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return {
            "available": True,
            "pci_bus_id": bus_id,
            "gpu_util_percent": utilization.gpu,
            "memory_util_percent": utilization.memory,
            "memory_free_bytes": memory.free,
            "memory_total_bytes": memory.total,
        }
    finally:
        pynvml.nvmlShutdown()


def run_check() -> dict:
    doc = {"gpu": False, "python": platform.python_version(), "numpy": np.__version__}
    reason = gpu_unavailable_reason()
    if reason is not None:
        doc.update(reason=reason, scheduler=guarded(scheduler_section))
        return doc
    ops = import_ops()
    doc["gpu"] = True
    doc["device"] = guarded(device_info)
    copy_bps = device_copy_bytes_per_s()
    doc["device_copy_gb_per_s"] = round(copy_bps / 1e9, 2)
    doc["kernels"] = kernel_checks(ops, copy_bps)
    doc["all_bit_identical"] = all(k.get("bit_identical") is True for k in doc["kernels"].values())
    doc["host_to_device"] = guarded(host_to_device)
    doc["table_placement"] = guarded(table_placement_section)
    doc["nvml"] = guarded(nvml_readings)
    doc["scheduler"] = guarded(scheduler_section)
    doc["seconds"] = round(time.perf_counter() - START, 1)
    return doc


def main() -> int:
    try:
        doc = run_check()
    except Exception as exc:
        doc = {"gpu": None, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    print(json.dumps(doc, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
