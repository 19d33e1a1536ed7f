"""Blocks of row records whose columns' types differ from block to block (a table cache keeps each chunk's
integer columns in the narrowest type holding that chunk's values: one column uint8 in one chunk, uint16 in the
next, at another place in the record) are gathered in one native call (``gather_blocks``, ``gather_table``),
with the bits one ``gather_columns`` per block writes (NumPy's, the reference): columns laid out alike in every
block in the batch's order, the others block by block. A table read back from its table cache takes that call
for every batch, by address (its cached chunks found by number, no grouping in Python) or grouped, never the
per-block path, with the bits of the table read without a cache."""
from __future__ import annotations

import numpy as np
import pytest

from feedline import ops
from feedline.datagen.synthetic_criteo import make_criteo
from feedline.loader.cache_policy import CacheSettings
from feedline.loader.sources import chunked, open_source
from feedline.loader.sources.columnar import RecordLayout
from feedline.ops import _native
from feedline.ops.gather_columns import block_addresses, gather_blocks, gather_table
from feedline.pipelines.criteo import criteo
from record_blocks import per_block_reference, some_values
from test_gather_table import gathered

needs_numba = pytest.mark.skipif(_native.kernels("gather") is None, reason="numba is not installed")
pytestmark = pytest.mark.usefixtures("fresh_index_store")

# Per block, its columns' types: columns 0-3 and 8 differ between blocks (1 and 3 as a table cache narrows
# them), 4-7 are alike in every block (their places in the record still move with the others').
KINDS = [
    [np.uint8, np.uint8, np.int8, np.uint16, np.uint32, np.int32, np.int64, np.float32, np.float64],
    [np.uint16, np.uint8, np.int16, np.uint8, np.uint32, np.int32, np.int64, np.float32, np.float32],
    [np.uint32, np.uint16, np.int32, np.uint16, np.uint32, np.int32, np.int64, np.float32, np.float64],
    [np.int64, np.uint16, np.int8, np.uint32, np.uint32, np.int32, np.int64, np.float32, np.float64],
]
INTS = [0, 1, 2, 3, 4, 5, 6]


def narrow_block(rng, types, rows: int, bits: list[int] | None = None, flag_bytes: int | None = None):
    """A block of ``rows`` records of ``types`` (places as ``RecordLayout`` gives them), column ``j``'s missing
    flag in bit ``bits[j]`` of ``flag_bytes`` a row; with its values and missing flags."""
    records = RecordLayout([np.dtype(d) for d in types])
    bits = list(range(len(types))) if bits is None else bits
    flag_bytes = records.flag_bytes if flag_bytes is None else flag_bytes
    columns = [some_values(rng, d, rows) for d in types]
    missing = [rng.random(rows) < 0.3 for _ in types]
    flags_at = -(-rows * records.record // 8) * 8
    data = np.zeros(flags_at + -(-rows * flag_bytes // 8) * 8, dtype=np.uint8)
    view = data[:rows * records.record].reshape(rows, records.record)
    for j, values in enumerate(columns):
        view[:, records.offsets[j]:records.offsets[j] + values.itemsize] = values.view(np.uint8).reshape(rows, -1)
    flags = np.zeros((rows, 8 * flag_bytes), dtype=bool)
    for j, b in enumerate(bits):
        flags[:, b] = missing[j]
    data[flags_at:flags_at + rows * flag_bytes] = np.packbits(flags, axis=1, bitorder="little").reshape(-1)
    block = ops.ColumnBlock.records(data, records.dtypes, records.offsets, records.record, flags_at, bits,
                                    flag_bytes, rows)
    return block, columns, missing


def outputs(n: int):
    return (np.full(n, -5, np.float32), np.full((len(KINDS[0]), n), -5, np.float32),
            np.full((len(INTS), n), -5, np.int64))


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def made_blocks(rng, case: str):
    sizes = [1500, 700, 333, 2000]
    if case == "types":
        return [narrow_block(rng, KINDS[k], rows) for k, rows in enumerate(sizes)], sizes
    if case == "flag bits":  # the same types, a block's flags in other bits (two of its columns' swapped)
        swapped = [1, 0] + list(range(2, len(KINDS[0])))
        return [narrow_block(rng, KINDS[0], rows, swapped if k == 2 else None) for k, rows in enumerate(sizes)], sizes
    # flag bytes: a block with its flags spread over 3 bytes a row (every column then read block by block)
    spread = [0, 1, 2, 3, 4, 5, 6, 7, 17]
    return [narrow_block(rng, KINDS[k], rows, spread if k == 1 else None, 3 if k == 1 else None)
            for k, rows in enumerate(sizes)], sizes


@needs_numba
@pytest.mark.parametrize("case", ["types", "flag bits", "flag bytes"])
@pytest.mark.parametrize("n", [1, 900, 4000])
def test_blocks_of_differing_types_are_gathered_in_one_call_with_the_bits_of_a_call_per_block(case, n,
                                                                                                monkeypatch):
    rng = np.random.default_rng([len(case), n])
    made, sizes = made_blocks(rng, case)
    first_row = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    rows = rng.integers(0, sum(sizes), n)
    rows[:min(n, 4)] = (first_row + np.array(sizes) - 1)[:min(n, 4)]  # each block's last row (its flags end it)
    chunks, bounds, local, positions = ops.group_by_chunk(rows, first_row, sum(sizes))
    blocks = [made[c][0] for c in chunks.tolist()]
    picks = ops.gather_picks(len(KINDS[0]) - 1, list(range(len(KINDS[0]))), INTS)
    got = outputs(n)
    assert gather_blocks(blocks, picks, bounds, local, positions, missing_id=-99, label=got[0], dense=got[1],
                         ids=got[2])
    want = per_block_reference(blocks, picks, bounds, local, positions, outputs(n), monkeypatch)
    for a, b in zip(got, want):
        assert same(a, b)
    # and against the values written, independently of either
    chunk_of = np.searchsorted(first_row, rows, side="right") - 1
    within = rows - first_row[chunk_of]
    for j in range(len(KINDS[0])):
        gone = np.array([made[c][2][j][r] for c, r in zip(chunk_of, within)], dtype=bool)
        written = np.array([np.float32(made[c][1][j][r]) for c, r in zip(chunk_of, within)], dtype=np.float32)
        assert same(got[1][j], np.where(gone, np.float32(np.nan), written)), j
        if j in INTS:
            ints = np.array([int(made[c][1][j][r]) for c, r in zip(chunk_of, within)], dtype=np.int64)
            assert same(got[2][INTS.index(j)], np.where(gone, np.int64(-99), ints)), j
    # by address, grouping the rows itself: the same bits
    addresses = np.array([block_addresses(made[c][0]) for c in range(len(sizes))], dtype=np.int64)
    layouts = np.array([made[c][0].layout for c in range(len(sizes))], dtype=np.int64)
    touched = np.empty(len(sizes), np.int64)
    by_address = outputs(n)
    assert gather_table(rows, first_row, sum(sizes), addresses, layouts, picks, touched, missing_id=-99,
                        label=by_address[0], dense=by_address[1], ids=by_address[2]) == chunks.size
    assert touched[:chunks.size].tolist() == chunks.tolist()
    for a, b in zip(by_address, want):
        assert same(a, b)


ROWS = 40_000  # 9 chunks of text


@needs_numba
def test_a_table_read_back_from_its_table_cache_is_gathered_in_one_call(tmp_path, monkeypatch):
    make_criteo(tmp_path / "day.tsv", ROWS, seed=4)
    spec = criteo(str(tmp_path / "day.tsv"))
    settings = CacheSettings(mode="on", directory=str(tmp_path / "cache"))
    writer = open_source(spec.source, cache_rows=ROWS, cache=settings)
    writer.read(np.arange(ROWS))  # every chunk parsed and kept
    by_address = open_source(spec.source, cache_rows=ROWS, cache=settings)
    grouped = open_source(spec.source, cache_rows=ROWS, cache=settings)
    grouped._by_address = False  # the rows grouped in Python, the blocks gathered in one call
    plain = open_source(spec.source, cache_rows=ROWS)
    for source in (by_address, grouped):
        source.warm(list(range(source.chunk_rows.size)))
    kinds = {by_address._cache.cached(c).block.layout[:, 0].tobytes() for c in range(by_address.chunk_rows.size)}
    assert len(kinds) > 1  # the chunks' narrow types differ (else this tests nothing new)
    answers, per_block = {"gather_table": [], "gather_blocks": []}, []
    real_per_block = chunked.ops.gather_columns

    def counted(name):
        real = getattr(chunked, name)

        def call(*args, **kwargs):
            answers[name].append(real(*args, **kwargs))
            return answers[name][-1]
        return call

    def per_block_gather(*args, **kwargs):
        per_block.append(1)
        return real_per_block(*args, **kwargs)

    for seed in range(3):
        rows = np.random.default_rng(seed).permutation(ROWS)[:5000]
        want = gathered(spec, plain, rows)
        with monkeypatch.context() as m:
            for name in answers:
                m.setattr(chunked, name, counted(name))
            m.setattr(chunked.ops, "gather_columns", per_block_gather)
            assert gathered(spec, by_address, rows) == want
            assert gathered(spec, grouped, rows) == want
    assert len(answers["gather_table"]) == 3 and all(a > 1 for a in answers["gather_table"])
    assert answers["gather_blocks"] == [True] * 3 and not per_block
