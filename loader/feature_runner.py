"""Runs a tabular feature pipeline for one placement: stages before the cut on the CPU with NumPy in worker
threads, one host-to-device copy per batch at the cut, the rest on the GPU with CuPy, torch tensors out.

A batch is a dict of torch tensors on ``device``:
``label`` float32 [B]; ``dense`` float32 [B, D]; ``index`` int64 [B] (= ``plan.indices``); ``valid`` bool [B]
when the plan holds padding; ``sparse`` = ``{"keys", "values" int64, "lengths" int32, "offsets" int64}`` in
TorchRec's key-major layout, so ``KeyedJaggedTensor(**batch["sparse"])`` takes it as is.
"""
from __future__ import annotations

import functools
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .. import ops
from ..pipelines.spec import PipelineSpec
from ..pipelines.tabular import MISSING_ID, TabularFiles
from .devices import available_cores, parse_device
from .errors import PlacementError
from .sampler import BatchPlan

MAX_PREFETCH = 64
_THREAD_PREFIX = "feedline-features"
_ALIGN = 16


def _may_join() -> bool:
    """Whether this thread may wait for a pool's workers. A stream dropped in a reference cycle is closed by
    the garbage collector on whatever thread runs it: one of the pool's own (which cannot join itself), or a
    thread still starting inside the threading module (seen as a dummy thread; joining there deadlocks on
    the module's own lock). Those leave the workers to finish on their own."""
    current = threading.current_thread()
    return not isinstance(current, threading._DummyThread) and not current.name.startswith(_THREAD_PREFIX)


class FeatureRunner:
    def __init__(self, spec: PipelineSpec, cut: int, device: str | torch.device | None, *, prefetch: int = 2,
                 num_threads: int | None = None):
        if not isinstance(spec, PipelineSpec) or not isinstance(spec.source, TabularFiles):
            raise TypeError(f"FeatureRunner runs tabular pipelines (a PipelineSpec whose source is TabularFiles), "
                            f"got {type(spec).__name__} with source {type(getattr(spec, 'source', None)).__name__}")
        if isinstance(cut, bool) or not isinstance(cut, int) or cut not in spec.valid_cuts():
            raise ValueError(f"cut must be one of pipeline {spec.name!r}'s valid cuts {spec.valid_cuts()}, got {cut!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or not 1 <= prefetch <= MAX_PREFETCH:
            raise ValueError(f"prefetch must be an integer in [1, {MAX_PREFETCH}], got {prefetch!r}")
        if num_threads is None:
            num_threads = min(4, available_cores())
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be a positive integer, got {num_threads!r}")
        self.spec = spec
        self.cut = cut
        self.device = parse_device(device)
        self.on_gpu = cut < spec.all_cpu
        if self.on_gpu and self.device.type != "cuda":
            raise PlacementError(f"placement {spec.describe_cut(cut)!r} runs {[s.name for s in spec.stages[cut:]]} "
                                 f"on the GPU, so batches must be delivered on a CUDA device, got device={self.device}")
        self.prefetch = prefetch
        self.num_threads = num_threads
        self.reader = spec.source.open()
        self.num_samples = self.reader.num_rows
        stage_impl: dict[str, Callable] = {"parse": self._parse, "dense": _dense, "hash": _hash,
                                           "multi_hot": _multi_hot, "assemble": _assemble}
        self._cpu_stages = [(stage_impl[s.name], s.params) for s in spec.stages[:cut]]
        self._gpu_stages = [(stage_impl[s.name], s.params) for s in spec.stages[cut:]]
        self._keys = tuple(spec.stage("assemble").params["keys"]) if "sparse" in spec.outputs else ()
        # What crosses to the GPU at the cut: whatever the GPU stages or the outputs need from the CPU stages.
        made_on_cpu = {name for stage in spec.stages[:cut] for name in stage.produces}
        needed = set(spec.outputs).union(*(stage.consumes for stage in spec.stages[cut:]))
        self._crossing = tuple(sorted(made_on_cpu & needed))

    @property
    def skipped(self):
        """Bad rows left out when the files were opened with ``on_error="skip"``: (file, line, reason)."""
        return self.reader.skipped

    def batches(self, plans: Iterator[BatchPlan]) -> Iterator[dict[str, Any]]:
        plans = iter(plans)
        depth = max(self.prefetch, self.num_threads)
        pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix=_THREAD_PREFIX)
        pending: deque = deque()
        try:
            while True:
                while len(pending) < depth:
                    plan = next(plans, None)
                    if plan is None:
                        break
                    pending.append((plan, pool.submit(self._host_part, plan)))
                if not pending:
                    return
                plan, future = pending.popleft()
                try:
                    host = future.result()
                except BaseException as e:
                    if hasattr(e, "add_note"):
                        rows = plan.indices
                        e.add_note(f"raised in a feedline feature worker thread preparing a batch of {rows.size} "
                                   f"rows (first {rows[:4].tolist()})")
                    raise
                yield self._device_part(plan, host)
        finally:
            for _, future in pending:
                future.cancel()
            pool.shutdown(wait=_may_join(), cancel_futures=True)

    def _host_part(self, plan: BatchPlan):
        data = {"indices": plan.indices}
        for run, params in self._cpu_stages:
            data.update(run(data, params, np))
        moving = {name: data[name] for name in self._crossing} if self.on_gpu else _plain(data, self.spec.outputs)
        if self.device.type == "cpu":
            return moving
        moving["index"] = np.asarray(plan.indices, dtype=np.int64)
        if not plan.valid.all():
            moving["valid"] = np.asarray(plan.valid, dtype=bool)
        return _pack(moving)

    def _device_part(self, plan: BatchPlan, host) -> dict[str, Any]:
        if self.device.type == "cpu":
            batch = _convert(host, torch.from_numpy)
            batch["index"] = torch.from_numpy(np.array(plan.indices, dtype=np.int64))
            if not plan.valid.all():
                batch["valid"] = torch.from_numpy(np.array(plan.valid, dtype=bool))
        elif not self.on_gpu:
            batch = _unpack(torch.from_numpy(host[0]).to(self.device), host[1], _torch_view)
        else:
            batch = self._run_gpu(host)
        if "sparse" in batch:
            batch["sparse"] = {"keys": list(self._keys), **batch["sparse"]}
        return batch

    def _run_gpu(self, host) -> dict[str, Any]:
        import cupy

        with cupy.cuda.Device(self.device.index or 0), \
                cupy.cuda.ExternalStream(torch.cuda.current_stream(self.device).cuda_stream):
            data = _unpack(cupy.asarray(host[0]), host[1], _cupy_view)
            for run, params in self._gpu_stages:
                data.update(run(data, params, cupy))
            out = _plain(data, self.spec.outputs)
            out.update({name: data[name] for name in ("index", "valid") if name in data})
            return _convert(out, torch.from_dlpack)

    def _parse(self, data: dict, params, xp) -> dict[str, Any]:
        columns = self.reader.read(data["indices"])
        out: dict[str, Any] = {}
        if params["label"] is not None:
            out["label"] = columns[params["label"]].values.astype(np.float32)
        if params["dense"]:
            raw = np.stack([columns[name].values for name in params["dense"]]).astype(np.float32)
            raw[np.stack([columns[name].missing for name in params["dense"]])] = np.nan
            out["dense_raw"] = raw
        if params["categorical"]:
            ids = np.stack([columns[name].values for name in params["categorical"]])
            ids[np.stack([columns[name].missing for name in params["categorical"]])] = MISSING_ID
            out["categorical_raw"] = ids
        if params["lists"]:
            out["lists_raw"] = tuple(columns[name] for name in params["lists"])
        return out

    def close(self) -> None:
        pass


def _dense(data: dict, params, xp) -> dict[str, Any]:
    raw = data["dense_raw"]
    plain, bucketized = params["dense"], params["bucketized"]
    out: dict[str, Any] = {}
    if plain:
        groups: dict[tuple, list[int]] = {}
        for i, f in enumerate(plain):
            groups.setdefault((f.fill, f.clip_min, f.log1p), []).append(i)
        normalize = ops.normalize_dense if xp is not np else _normalize_memo
        if len(groups) == 1:
            (fill, clip, log), = groups
            normalized = normalize(raw[:len(plain)], fill, clip, log)
        else:
            normalized = xp.empty((len(plain), raw.shape[1]), dtype=np.float32)
            for (fill, clip, log), rows in groups.items():
                normalized[rows] = normalize(raw[rows], fill, clip, log)
        out["dense"] = xp.ascontiguousarray(normalized.T)
    if bucketized:
        ids = xp.empty((len(bucketized), raw.shape[1]), dtype=np.int64)
        for k, f in enumerate(bucketized):
            value = ops.normalize_dense(raw[len(plain) + k], f.fill, f.clip_min, f.log1p)
            ids[k] = ops.bucketize(value, xp.asarray(f.boundaries, dtype=np.float64))
        out["bucketized"] = ids
    return out


_MEMO_LOW, _MEMO_HIGH = -1024, 1 << 16


@functools.lru_cache(maxsize=64)
def _normalize_table(fill: float, clip: float | None, log: bool) -> tuple[np.ndarray, np.float32]:
    table = ops.normalize_dense(np.arange(_MEMO_LOW, _MEMO_HIGH, dtype=np.float32), fill, clip, log)
    return table, ops.normalize_dense(np.full(1, np.nan, dtype=np.float32), fill, clip, log)[0]


def _normalize_memo(x: np.ndarray, fill: float, clip: float | None, log: bool) -> np.ndarray:
    """``ops.normalize_dense`` on the CPU, bit for bit: an elementwise function, so its values at the small
    integers (most counts) and at NaN (missing) are computed once and looked up; other values are computed."""
    table, at_nan = _normalize_table(fill, clip, log)
    with np.errstate(invalid="ignore"):
        small = (x >= _MEMO_LOW) & (x < _MEMO_HIGH)
    whole = np.where(small, x, 0).astype(np.int64)
    out = table[whole - _MEMO_LOW]
    other = ~(small & (whole == x)) | (x.view(np.uint32) == np.uint32(0x80000000))  # -0.0 keeps its sign
    if other.any():
        nan = np.isnan(x)
        out[nan] = at_nan
        other &= ~nan
        if other.any():
            out[other] = ops.normalize_dense(x[other], fill, clip, log)
    return out


def _hash(data: dict, params, xp) -> dict[str, Any]:
    raw = data["categorical_raw"]
    categorical, crosses = params["categorical"], params["crosses"]
    ids = xp.empty((len(categorical) + len(crosses), raw.shape[1]), dtype=np.int64)
    for k, (row, num_buckets, seed) in enumerate(categorical):
        ids[k] = ops.hash_buckets(raw[row], num_buckets, seed)
    for k, (a, b, num_buckets, seed) in enumerate(crosses, start=len(categorical)):
        ids[k] = ops.cross(raw[a], raw[b], num_buckets, seed)
    return {"categorical_ids": ids}


def _multi_hot(data: dict, params, xp) -> dict[str, Any]:
    return {"multi_hot_ids": tuple(ops.multi_hot(col.offsets, col.values, f.num_buckets, f.seed, f.max_len)
                                   for col, f in zip(data["lists_raw"], params["columns"]))}


def _assemble(data: dict, params, xp) -> dict[str, Any]:
    values, lengths = [], []
    for name in ("categorical_ids", "bucketized"):
        if name in data:
            values.append(data[name].ravel())
            lengths.append(xp.ones(data[name].size, dtype=np.int32))
    for jagged in data.get("multi_hot_ids", ()):
        values.append(jagged.values)
        lengths.append(jagged.lengths)
    lengths = xp.concatenate(lengths)
    offsets = xp.zeros(lengths.size + 1, dtype=np.int64)
    xp.cumsum(lengths, dtype=np.int64, out=offsets[1:])
    return {"sparse": ops.Jagged(xp.concatenate(values), lengths, offsets)}


# Moving a batch: every array of a nested structure (dicts, tuples, named tuples, Jagged) packed into one
# contiguous host buffer, copied once, and viewed again on the other side.

def _leaves(obj, out: list) -> Any:
    """``obj`` with every array (any leaf of dicts, tuples and Jagged) replaced by its position in ``out``."""
    if isinstance(obj, dict):
        return {k: _leaves(v, out) for k, v in obj.items()}
    if isinstance(obj, ops.Jagged):
        return ("jagged", _leaves(obj.values, out), _leaves(obj.lengths, out), _leaves(obj.offsets, out))
    if isinstance(obj, tuple):
        return (type(obj), tuple(_leaves(v, out) for v in obj))
    out.append(obj)
    return len(out) - 1


def _rebuild(shape, arrays: list) -> Any:
    if isinstance(shape, int):
        return arrays[shape]
    if isinstance(shape, dict):
        return {k: _rebuild(v, arrays) for k, v in shape.items()}
    if shape[0] == "jagged":
        return ops.Jagged(*(arrays[i] for i in shape[1:]))
    kind, items = shape
    items = [_rebuild(v, arrays) for v in items]
    return kind(*items) if kind is not tuple else tuple(items)


def _pack(data: dict) -> tuple[np.ndarray, tuple]:
    arrays: list[np.ndarray] = []
    shape = _leaves(data, arrays)
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += -(-a.nbytes // _ALIGN) * _ALIGN
    buffer = np.empty(max(total, _ALIGN), dtype=np.uint8)
    for a, offset in zip(arrays, offsets):
        buffer[offset:offset + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return buffer, (shape, [(o, a.dtype, a.shape) for o, a in zip(offsets, arrays)])


def _unpack(buffer, layout: tuple, view: Callable) -> Any:
    shape, leaves = layout
    arrays = [view(buffer, offset, dtype, dims) for offset, dtype, dims in leaves]
    return _rebuild(shape, arrays)


def _cupy_view(buffer, offset: int, dtype: np.dtype, dims: tuple):
    nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    return buffer[offset:offset + nbytes].view(dtype).reshape(dims)


_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.int64): torch.int64,
                 np.dtype(np.int32): torch.int32, np.dtype(np.bool_): torch.bool, np.dtype(np.float64): torch.float64}


def _torch_view(buffer: torch.Tensor, offset: int, dtype: np.dtype, dims: tuple):
    nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    return buffer[offset:offset + nbytes].view(_TORCH_DTYPES[dtype]).reshape(dims)


def _convert(data, convert: Callable):
    arrays: list = []
    shape = _leaves(data, arrays)
    return _rebuild(shape, [convert(a) for a in arrays])


def _plain(data: dict, names: tuple[str, ...]) -> dict[str, Any]:
    """The named outputs, a Jagged becoming a dict of its three arrays."""
    return {name: ({"values": data[name].values, "lengths": data[name].lengths, "offsets": data[name].offsets}
                   if isinstance(data[name], ops.Jagged) else data[name]) for name in names}
