"""The whole-batch CPU kernels (numba) against their NumPy references, bit for bit: ``hash_columns`` against
``_murmur3_words.hash_words`` (NumPy MurmurHash3) and scikit-learn, ``normalize_columns`` against
``normalize_dense``, ``gather_columns``/``gather_raw``/``group_by_chunk`` against their NumPy code and a plain
definition; and the same functions with numba switched off."""
from __future__ import annotations

import importlib
import subprocess
import sys

import numpy as np
import pytest
from sklearn.utils import murmurhash3_32 as sk_murmur3

from feedline import ops
from feedline.ops import _native
from feedline.ops._murmur3_words import hash_words, key_words
import record_blocks

gather_module = importlib.import_module("feedline.ops.gather_columns")
rng = np.random.default_rng(2024)
needs_numba = pytest.mark.skipif(_native.kernels("murmur3") is None, reason="numba is not installed")


@pytest.fixture(params=["native", "numpy"])
def path(request, monkeypatch):
    """Each test runs with the numba kernels and again with numba switched off (the NumPy fallback)."""
    if request.param == "native" and _native.kernels("murmur3") is None:
        pytest.skip("numba is not installed")
    if request.param == "numpy":
        monkeypatch.setenv(_native.ENV, "0")
    _native.kernels.cache_clear()
    yield request.param
    _native.kernels.cache_clear()


def numpy_buckets(keys: np.ndarray, num_buckets: int, seed: int) -> np.ndarray:
    out = np.empty(keys.size, dtype=np.int64)
    return hash_words([key_words(np.ascontiguousarray(keys))], seed, num_buckets, out)


def numpy_cross(a: np.ndarray, b: np.ndarray, num_buckets: int, seed: int) -> np.ndarray:
    out = np.empty(a.size, dtype=np.int64)
    return hash_words([key_words(np.ascontiguousarray(a)), key_words(np.ascontiguousarray(b))], seed, num_buckets,
                      out)


EDGE_KEYS = np.array([0, 1, -1, 2**31 - 1, -(2**31), 2**32 - 1, 2**32, 2**63 - 1, -(2**63)], dtype=np.int64)
BUCKETS = [1, 2, 3, 7, 1 << 20, 1_000_003, 2**31 - 1, 2**31, 2**32 - 5, 2**32 - 1]


def test_hash_columns_equal_numpy_murmur3_per_column(path):
    raw = rng.integers(-(2**63), 2**63 - 1, (len(BUCKETS), 5000), dtype=np.int64, endpoint=True)
    raw[:, :EDGE_KEYS.size] = EDGE_KEYS
    seeds = [0, 1, 42, 2**32 - 1, 7, 9, 123456789, 3, 5, 11]
    targets = rng.permutation(len(BUCKETS) + 3)[:len(BUCKETS)]
    out = np.full((len(BUCKETS) + 3, raw.shape[1]), -7, dtype=np.int64)
    ops.hash_columns(raw, ops.hash_plan(np.arange(len(BUCKETS))[::-1], BUCKETS, seeds, targets), out)
    for k, (n, seed, target) in enumerate(zip(BUCKETS, seeds, targets)):
        assert np.array_equal(out[target], numpy_buckets(raw[len(BUCKETS) - 1 - k], n, seed)), (n, seed)
    untouched = sorted(set(range(out.shape[0])) - set(targets.tolist()))
    assert (out[untouched] == -7).all()


def test_hash_columns_match_sklearn(path):
    raw = EDGE_KEYS.reshape(1, -1)
    out = ops.hash_columns(raw, ops.hash_plan([0, 0], [1_000_003, 2**32 - 1], [5, 2**32 - 1]))
    for row, (n, seed) in enumerate([(1_000_003, 5), (2**32 - 1, 2**32 - 1)]):
        expected = [sk_murmur3(int(v).to_bytes(8, "little", signed=True), seed, positive=True) % n for v in EDGE_KEYS]
        assert out[row].tolist() == expected


def test_crosses_equal_numpy_murmur3(path):
    raw = rng.integers(-(2**63), 2**63 - 1, (4, 3000), dtype=np.int64, endpoint=True)
    pairs = [[0, 1], [1, 0], [3, 2], [2, 2]]
    out = ops.hash_columns(raw, ops.hash_plan(pairs, [977, 2**32 - 1, 1, 65536], [1, 2, 3, 2**32 - 1]))
    for k, ((a, b), n, seed) in enumerate(zip(pairs, [977, 2**32 - 1, 1, 65536], [1, 2, 3, 2**32 - 1])):
        assert np.array_equal(out[k], numpy_cross(raw[a], raw[b], n, seed))
    a, b = int(raw[0, 0]), int(raw[1, 0])
    key = a.to_bytes(8, "little", signed=True) + b.to_bytes(8, "little", signed=True)
    assert out[0, 0] == sk_murmur3(key, 1, positive=True) % 977


@needs_numba
@pytest.mark.parametrize("n", [1, 2, 3, 10, 641, 65537, 1_000_003, 2**31 - 1, 2**31 + 1, 2**32 - 5, 2**32 - 1])
def test_the_division_free_modulo_is_exact_next_to_every_multiple(n):
    """Lemire's direct remainder, checked where h lies next to a multiple of n (where a quotient is off by one)."""
    from feedline.ops._murmur3_numba import bucket_of

    q = np.unique(np.concatenate([np.arange(0, 2000), rng.integers(0, (2**32 - 1) // n + 1, 5000)]))
    around = (q[:, None] * n + np.array([-2, -1, 0, 1, 2])).reshape(-1)
    hashes = np.concatenate([around[(around >= 0) & (around < 2**32)],
                             rng.integers(0, 2**32, 20000), [0, 1, 2**32 - 2, 2**32 - 1]]).astype(np.uint32)
    out = np.empty(hashes.size, dtype=np.int64)
    bucket_of(hashes, n, out)
    assert np.array_equal(out, hashes.astype(np.int64) % n)


def test_hash_buckets_equal_numpy_murmur3_for_every_key_type(path):
    for dtype in (np.int64, np.uint64, np.int32, np.uint32):
        info = np.iinfo(dtype)
        keys = rng.integers(info.min, info.max, 4000, dtype=dtype, endpoint=True).reshape(40, 100)
        for n in (None, 1, 97, 2**32 - 1):
            want = np.empty(keys.size, dtype=np.uint32 if n is None else np.int64)
            hash_words([key_words(keys)], 9, n, want)
            got = ops.murmur3_32(keys, 9) if n is None else ops.hash_buckets(keys, n, 9)
            assert got.shape == keys.shape and np.array_equal(got.reshape(-1), want), (dtype, n)


def test_hash_plans_are_checked():
    with pytest.raises(ValueError, match="num_buckets must lie in"):
        ops.hash_plan([0], [0], [0])
    with pytest.raises(ValueError, match="seeds must lie in"):
        ops.hash_plan([0], [3], [2**32])
    with pytest.raises(ValueError, match="one entry per key"):
        ops.hash_plan([0, 1], [3], [0, 0])
    with pytest.raises(ValueError, match="distinct"):
        ops.hash_plan([0, 1], [3, 3], [0, 0], [1, 1])
    with pytest.raises(ValueError, match=r"\[K\] or \[K, 2\]"):
        ops.hash_plan([[0, 1, 2]], [3], [0])
    plan = ops.hash_plan([0, 2], [3, 3], [0, 0])
    with pytest.raises(ValueError, match="raw has 2 rows"):
        ops.hash_columns(np.zeros((2, 4), np.int64), plan)
    with pytest.raises(TypeError, match="2-D int64"):
        ops.hash_columns(np.zeros((3, 4), np.int32), plan)
    with pytest.raises(ValueError, match="out must be"):
        ops.hash_columns(np.zeros((3, 4), np.int64), plan, np.zeros((2, 5), np.int64))


def random_float32(n: int) -> np.ndarray:
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([np.nan, np.inf, -np.inf, -1.0, -0.0, 0.0, 1e-45, -1e-45, 1e-40, 2**-29, -(2**-29),
                        -0.999999, 65535, 65536, -1024, 3.4e38], dtype=np.float32)
    whole = np.floor(rng.lognormal(2, 3, n)).astype(np.float32)  # counts, as in Criteo
    return np.concatenate([special, bits, whole, -whole])


@pytest.mark.parametrize("fill,clip,log", [(0.0, 0.0, True), (-3.0, None, True), (float("nan"), -2.0, True),
                                           (1.5, 0.25, False), (0.0, None, False), (2.0, -1.0, True)])
def test_normalize_columns_equal_normalize_dense_bit_for_bit(path, fill, clip, log):
    values = random_float32(60_000)
    raw = np.stack([np.roll(values, 7 * k) for k in range(3)])
    plan = ops.dense_plan([2, 0, 1, 0], [fill, 0.0, fill, 5.0], [clip, 0.0, clip, None], [log, True, log, False])
    out = ops.normalize_columns(raw, plan)
    for j, (source, f, c, lg) in enumerate([(2, fill, clip, log), (0, 0.0, 0.0, True), (1, fill, clip, log),
                                            (0, 5.0, None, False)]):
        want = ops.normalize_dense(raw[source], f, c, lg)
        assert np.array_equal(out[:, j].view(np.uint32), want.view(np.uint32)), j


def test_dense_plans_are_checked():
    with pytest.raises(ValueError, match="clip_min must not be NaN"):
        ops.dense_plan([0], [0.0], [float("nan")], [True])
    with pytest.raises(TypeError, match="log must hold bools"):
        ops.dense_plan([0], [0.0], [0.0], [1])
    with pytest.raises(ValueError, match="one entry per column"):
        ops.dense_plan([0, 1], [0.0], [0.0, 0.0], [True, True])
    with pytest.raises(ValueError, match="shape"):
        ops.normalize_columns(np.zeros((1, 4), np.float32), ops.dense_plan([0], [0.0], [0.0], [True]),
                              np.zeros((4, 2), np.float32))


DTYPES = [np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.int64, np.float32, np.float64]


def column_chunk(columns: list[np.ndarray], missing: list[np.ndarray]) -> ops.ColumnBlock:
    """A block laid out as converted tables store a chunk: each column's values, then each one's flag bits."""
    rows = columns[0].size
    data = bytearray()
    layout = []
    for values in columns:
        data += b"\0" * (-len(data) % 8)
        layout.append([gather_module.CODES[values.dtype], len(data) // values.itemsize, 1])
        data += values.tobytes()
    data += b"\0" * (-len(data) % 8)
    for entry, flags in zip(layout, missing):
        entry += [gather_module.BIT_FLAGS, 8 * len(data), 1]
        data += np.packbits(flags, bitorder="little").tobytes()
        data += b"\0" * (-len(data) % 8)
    buffer = np.frombuffer(bytes(data), dtype=np.uint8)
    return ops.ColumnBlock(buffer, buffer, np.array(layout, dtype=np.int64), rows)


def some_values(dtype, rows: int) -> np.ndarray:
    return record_blocks.some_values(rng, dtype, rows)


def test_gather_columns_reads_every_type_and_layout(path):
    rows = 700
    columns = [some_values(d, rows) for d in DTYPES]
    missing = [rng.random(rows) < 0.3 for _ in DTYPES]
    ints = np.stack([c.astype(np.int64) for c in columns[:7]], axis=1)
    blocks = {"column chunk": column_chunk(columns, missing),
              "row-major": ops.ColumnBlock.row_major(ints, np.ascontiguousarray(np.stack(missing[:7], axis=1)))}
    local = rng.integers(0, rows, 300)
    positions = rng.permutation(400)[:300]
    for name, block in blocks.items():
        count = block.layout.shape[0]
        picks = np.array([(c, gather_module.IDS, c) for c in range(min(count, 7))]
                         + [(c, gather_module.DENSE, c) for c in range(count)]
                         + [(count - 1, gather_module.LABEL, 0)], dtype=np.int64)
        label = np.full(400, -5, np.float32)
        dense = np.full((count, 400), -5, np.float32)
        ids = np.full((7, 400), -5, np.int64)
        ops.gather_columns(block, picks, local, positions, missing_id=-99, label=label, dense=dense, ids=ids)
        for c in range(count):
            values = columns[c][local]
            want_dense = np.where(missing[c][local], np.float32(np.nan), values.astype(np.float32))
            assert np.array_equal(dense[c, positions].view(np.uint32), want_dense.view(np.uint32)), (name, c)
            if c < 7:
                assert np.array_equal(ids[c, positions], np.where(missing[c][local], -99, values.astype(np.int64)))
        assert np.array_equal(label[positions], columns[count - 1][local].astype(np.float32))
        untouched = np.setdiff1d(np.arange(400), positions)
        assert (ids[:, untouched] == -5).all() and (label[untouched] == -5).all(), name


def test_gather_columns_reads_records_with_bit_flags(path):
    """Blocks of row records with bit flags (converted tables' chunks, gathered by their own kernel path): every
    type, to every target, against the values written, over several tiles, the last row of the block
    included (its flag bytes end the buffer)."""
    rows = 1500
    types = record_blocks.EVERY_TYPE
    block, columns, missing = record_blocks.record_block(rng, types, rows)
    ints = [j for j, d in enumerate(types) if np.dtype(d).kind != "f"]
    local = np.concatenate([rng.integers(0, rows, 1200), [rows - 1, 0]])
    positions = rng.permutation(1300)[:local.size]
    picks = ops.gather_picks(len(types) - 1, list(range(len(types))), ints)
    label = np.full(1300, -5, np.float32)
    dense = np.full((len(types), 1300), -5, np.float32)
    ids = np.full((len(ints), 1300), -5, np.int64)
    ops.gather_columns(block, picks, local, positions, missing_id=-99, label=label, dense=dense, ids=ids)
    for j, values in enumerate(columns):
        want = np.where(missing[j][local], np.float32(np.nan), values[local].astype(np.float32))
        assert np.array_equal(dense[j, positions].view(np.uint32), want.view(np.uint32)), j
    for k, j in enumerate(ints):
        assert np.array_equal(ids[k, positions], np.where(missing[j][local], -99, columns[j][local].astype(np.int64)))
    assert np.array_equal(label[positions], columns[-1][local].astype(np.float32))
    untouched = np.setdiff1d(np.arange(1300), positions)
    assert (ids[:, untouched] == -5).all() and (dense[:, untouched] == -5).all() and (label[untouched] == -5).all()


def test_gather_raw_reads_columns_as_stored(path):
    rows = 500
    columns = [some_values(d, rows) for d in DTYPES]
    missing = [rng.random(rows) < 0.5 for _ in DTYPES]
    block = column_chunk(columns, missing)
    local = rng.integers(0, rows, 256)
    ints, floats, flags = ops.gather_raw(block, np.arange(7), np.array([8, 7]), local)
    assert np.array_equal(ints, np.stack([c[local].astype(np.int64) for c in columns[:7]], axis=1))
    assert np.array_equal(floats, np.stack([columns[8][local], columns[7][local].astype(np.float64)], axis=1))
    assert np.array_equal(flags, np.stack([missing[c][local] for c in (*range(7), 8, 7)], axis=1))


@pytest.mark.parametrize("first_row, num_rows", [
    (np.array([0, 10, 25, 26, 100, 400]), 500),   # chunks of any size
    (np.arange(0, 500, 64), 500),                 # a power of two rows each (found by a shift)
    (np.arange(0, 10_000, 2), 10_000)])           # more chunks than the kernel maps
@pytest.mark.parametrize("max_groups", [64, 2])
def test_group_by_chunk_splits_rows_by_chunk_in_order(path, max_groups, first_row, num_rows):
    first_row = first_row.astype(np.int64)
    rows = rng.integers(0, num_rows, 3000)
    if first_row.size > 100:  # rows of a few chunks, so that they fit in max_groups
        rows = first_row[rng.integers(0, first_row.size, max_groups)][rng.integers(0, max_groups, 3000)] + 1
    chunks, bounds, local, positions = ops.group_by_chunk(rows, first_row, num_rows, max_groups=max_groups)
    chunk_of = np.searchsorted(first_row, rows, side="right") - 1
    assert chunks.tolist() == list(dict.fromkeys(chunk_of.tolist()))  # order of first appearance
    assert sorted(positions.tolist()) == list(range(rows.size))
    for g, c in enumerate(chunks.tolist()):
        part = positions[bounds[g]:bounds[g + 1]]
        assert part.tolist() == np.flatnonzero(chunk_of == c).tolist()  # the rows' order kept
        assert np.array_equal(local[bounds[g]:bounds[g + 1]], rows[part] - first_row[c])
    for bad in (-1, num_rows):
        with pytest.raises(IndexError, match=rf"rows must lie in \[0, {num_rows}\)"):
            ops.group_by_chunk(np.array([3, bad, 7]), first_row, num_rows, max_groups=max_groups)


@pytest.mark.parametrize("first_row, num_rows", [
    (np.array([0, 10, 25, 26, 100, 400]), 500),   # chunks of any size: a search
    (np.arange(0, 500, 64), 500),                 # a power of two rows each, the last shorter: a shift
    (np.arange(0, 500, 60), 500),                 # equal, but not a power of two: a search
    (np.array([0]), 7)])
def test_touched_chunks_names_each_chunk_holding_a_row(path, first_row, num_rows):
    first_row = first_row.astype(np.int64)
    for rows in (rng.integers(0, num_rows, 3000), rng.integers(0, num_rows, 3), np.array([num_rows - 1, 0])):
        want = np.unique(np.searchsorted(first_row, rows, side="right") - 1)
        assert gather_module.touched_chunks(rows.astype(np.int64), first_row, num_rows).tolist() == want.tolist()
    for bad in (-1, num_rows):
        with pytest.raises(IndexError, match=rf"rows must lie in \[0, {num_rows}\)"):
            gather_module.touched_chunks(np.array([0, bad, 1]), first_row, num_rows)


def test_the_numba_module_spells_the_codes_of_the_python_one():
    numba_side = pytest.importorskip("feedline.ops._gather_numba")
    assert [getattr(numba_side, np.dtype(d).name.upper().replace("UINT", "U").replace("INT", "I")
                    .replace("FLOAT", "F")) for d in DTYPES] == [gather_module.CODES[np.dtype(d)] for d in DTYPES]
    for name in ("NO_FLAGS", "BYTE_FLAGS", "BIT_FLAGS", "LABEL", "DENSE", "IDS"):
        assert getattr(numba_side, name) == getattr(gather_module, name)


def test_ops_work_where_numba_cannot_be_imported():
    script = """
import sys
sys.modules["numba"] = None
import numpy as np
from feedline import ops
raw = np.arange(-3, 9, dtype=np.int64).reshape(2, 6)
out = ops.hash_columns(raw, ops.hash_plan([1, 0], [97, 13], [1, 2]))
assert out[0].tolist() == ops.hash_buckets(raw[1], 97, 1).tolist()
dense = ops.normalize_columns(raw.astype(np.float32), ops.dense_plan([0], [0.0], [0.0], [True]))
assert dense[:, 0].tolist() == ops.normalize_dense(raw[0].astype(np.float32)).tolist()
assert ops.murmur3_32(np.array([10], dtype=np.int64)).tolist() == [4004982076]
assert "numba" not in {k for k, v in sys.modules.items() if v is not None}
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_importing_ops_loads_no_kernel_module():
    script = """
import sys
import feedline.ops
print(sorted(k for k in sys.modules if k.startswith("numba") or k.endswith("_numba"))[:3])
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_sequence_rows_equal_the_numpy_mapping(path):
    """Positions of a sequence of pieces (a shuffled epoch's chunks laid end to end) to rows, padding wrapped."""
    sizes = rng.integers(1, 300, 40)
    seq_start = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    row_start = rng.permutation(np.concatenate([[0], np.cumsum(sizes)[:-1]])).astype(np.int64)
    total = int(sizes.sum())
    positions = rng.integers(0, total + 500, 20_000).astype(np.int64)
    rows = np.empty(positions.size, np.int64)
    valid = np.empty(positions.size, bool)
    ops.sequence_rows(positions, 7, total, seq_start, row_start, rows, valid)
    p = positions + 7
    assert np.array_equal(valid, p < total)
    p = np.where(p < total, p, p % total)
    for i in range(0, positions.size, 97):
        k = max(j for j in range(sizes.size) if seq_start[j] <= p[i])
        assert rows[i] == row_start[k] + p[i] - seq_start[k]


def test_sequence_rows_of_a_shuffled_run_equal_the_numpy_mapping(path):
    """A window's positions: a permutation of a run of consecutive positions (the kernel lays the run out in
    order and reads it back), across pieces and past the end (padding wraps to the start)."""
    sizes = rng.integers(1, 300, 40)
    seq_start = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    row_start = rng.permutation(np.concatenate([[0], np.cumsum(sizes)[:-1]])).astype(np.int64)
    total = int(sizes.sum())
    for low, n in ((0, total), (123, 2_000), (total - 50, 400), (5, 1)):
        positions = (low + rng.permutation(n)).astype(np.int64)
        rows = np.empty(n, np.int64)
        valid = np.empty(n, bool)
        ops.sequence_rows(positions, 3, total, seq_start, row_start, rows, valid)
        p = positions + 3
        assert np.array_equal(valid, p < total)
        p = np.where(p < total, p, p % total)
        k = np.searchsorted(seq_start, p, side="right") - 1
        assert np.array_equal(rows, row_start[k] + p - seq_start[k])


def test_one_per_row(path):
    lengths = np.full(1001, 9, np.int32)
    offsets = np.full(1002, 9, np.int64)
    ops.one_per_row(lengths, offsets)
    assert (lengths == 1).all() and np.array_equal(offsets, np.arange(1002))
    with pytest.raises(ValueError, match="offsets must have len"):
        ops.one_per_row(lengths, offsets[:-1])


@needs_numba
@pytest.mark.parametrize("key, counter", [
    (0, (0, 0, 2, 0)), (0, (0, 5, 2, 3)), (7, (1, 0, 1, 9)), (2**64 + 3, (0, 2, 2, 1)),
    (2**128 - 1, (2**63 - 1, 0, 7, 4)), (12345, (2**64 - 2, 0, 0, 0)), (9, (2**64 - 1, 2**64 - 1, 2**64 - 1, 4))])
def test_seeded_permutation_is_numpys_philox_permutation(key, counter):
    """The window order a shuffled stream is delivered in, made by the GIL-free kernel: NumPy's own permutation
    bit for bit, at sizes that need one to all 32 bits of a draw (a draw redrawn while above ``i``), keys of both
    64-bit words, and counters whose lowest words carry into the next (the kernel itself: NumPy reads a list of
    counter words past 2**63 through float64, so ``seeded_permutation`` leaves those to NumPy)."""
    from feedline.ops.sequence_rows import seeded_permutation

    exact = np.array(counter, np.uint64)
    for size in (0, 1, 2, 3, 17, 1000, 65_536, 65_537, 100_003):
        if max(counter) < 2**63:
            expected = np.random.Generator(np.random.Philox(key=key, counter=list(counter))).permutation(size)
            got = seeded_permutation(key, counter, size)
            assert got.dtype == np.int64 and np.array_equal(got, expected), (key, counter, size)
        out = np.empty(size, np.int64)
        _native.kernels("sequence").seeded_permutation(np.array([key & (2**64 - 1), key >> 64], np.uint64), exact, out)
        assert np.array_equal(out, np.random.Generator(np.random.Philox(key=key, counter=exact)).permutation(size))


def test_seeded_permutation_outside_what_the_kernel_takes_is_numpys(monkeypatch):
    """A counter word past 64 bits is NumPy's to refuse, with NumPy's error, native kernel or not."""
    from feedline.ops.sequence_rows import seeded_permutation

    with pytest.raises((ValueError, OverflowError)):
        seeded_permutation(0, (2**64, 0, 0, 0), 10)
    with pytest.raises(ValueError):
        seeded_permutation(-1, (0, 0, 0, 0), 10)
