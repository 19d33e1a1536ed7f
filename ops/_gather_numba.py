"""Gathering rows of typed columns (numba): the CPU kernels behind ``gather_columns.py``, whose NumPy code is
their reference. Column ``c`` of a block is described by ``layout[c]`` = (code, start, step, flag kind, flag
start, flag step); see ``gather_columns.ColumnBlock``.

Rows are gathered a tile at a time (a tile's rows stay in cache across its columns). A column with missing bits
(``BIT_FLAGS``, as converted tables store them) going to the dense or id rows is gathered in one pass that
reads each value and its bit and writes the result in its place, a loop per type (``_placing``): 25-30% less
time for a converted Criteo batch than three passes. Other columns are loaded in three short passes (values
widened to int64 or float64, missing flags, then the output): the branches on type, flag kind and target stay
outside the loops without multiplying into each other. Values
are read through typed loads at byte addresses (``_read_*``), which compile as a load each, where typed views
of the buffer would each compile an overload of their own: the kernels compile in a few seconds.

Blocks of row records with bit flags (as converted tables store a chunk: every picked column steps by the same
record size, its flags a whole number of bytes a row) take their own path (``gather_records``): each row's
record address and flag bits are found once per tile, then each column is a loop of one load, one select and
one store per row: about 15% less time for a converted Criteo batch than a pass per column that finds both again
for every value. The records of the rows ``L2_AHEAD`` ahead are prefetched into L2 and those of the next tile
into L1 (the rows are random, so the hardware cannot guess them): another 20-25% less.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import types
from llvmlite import ir
from numba.extending import intrinsic

from ._numba import fast_loading, helper, kernel

# The codes of gather_columns.CODES, spelled again here for numba (tests check they agree).
U8, I8, U16, I16, U32, I32, I64, F32, F64 = range(9)
SIZES = (1, 1, 2, 2, 4, 4, 8, 4, 8)
NO_FLAGS, BYTE_FLAGS, BIT_FLAGS = range(3)
LABEL, DENSE, IDS = range(3)
NAN32 = np.float32(np.nan)
TILE = 256  # rows gathered at a time, column after column
L2_AHEAD = 512  # rows of records asked into L2 ahead of the tile gathered (about 128 KB of cache lines)
BLOCK_TILE, TILES_AHEAD = 128, 2  # gather_blocks' tile of rows, and how many tiles ahead its rows are prefetched


def _reader(kind):
    """An intrinsic reading one ``kind`` value at a byte address (any alignment)."""
    @intrinsic
    def read(typingctx, address):
        def codegen(context, builder, signature, args):
            pointer = builder.inttoptr(args[0], context.get_value_type(kind).as_pointer())
            return builder.load(pointer, align=1)
        return kind(types.int64), codegen
    return read


def _prefetcher(locality):
    """An intrinsic hinting that the cache line at byte ``address`` be brought closer (``llvm.prefetch`` for a
    read; ``locality`` 3: into every level, 2: into L2 and beyond)."""
    @intrinsic
    def prefetch(typingctx, address):
        def codegen(context, builder, signature, args):
            byte_pointer = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            function = builder.module.declare_intrinsic(
                "llvm.prefetch", [byte_pointer], ir.FunctionType(ir.VoidType(), [byte_pointer, i32, i32, i32]))
            builder.call(function, [builder.inttoptr(args[0], byte_pointer), i32(0), i32(locality), i32(1)])
            return context.get_dummy_value()
        return types.none(types.int64), codegen
    return prefetch


_prefetch, _prefetch_l2 = _prefetcher(3), _prefetcher(2)



_read_u8, _read_i8, _read_u16, _read_i16 = (_reader(t) for t in (types.uint8, types.int8, types.uint16, types.int16))
_read_u32, _read_i32, _read_i64 = (_reader(t) for t in (types.uint32, types.int32, types.int64))
_read_f32, _read_f64 = _reader(types.float32), _reader(types.float64)


@helper
def load_ints(address, code, start, step, local, out):
    """``out[i]`` = the int column's value at row ``local[i]``, as int64 (``address``: the buffer's first byte;
    ``start`` and ``step`` in bytes)."""
    n = local.shape[0]
    if code == U8:
        for i in range(n):
            out[i] = _read_u8(address + start + local[i] * step)
    elif code == I8:
        for i in range(n):
            out[i] = _read_i8(address + start + local[i] * step)
    elif code == U16:
        for i in range(n):
            out[i] = _read_u16(address + start + local[i] * step)
    elif code == I16:
        for i in range(n):
            out[i] = _read_i16(address + start + local[i] * step)
    elif code == U32:
        for i in range(n):
            out[i] = _read_u32(address + start + local[i] * step)
    elif code == I32:
        for i in range(n):
            out[i] = _read_i32(address + start + local[i] * step)
    else:
        for i in range(n):
            out[i] = _read_i64(address + start + local[i] * step)


@helper
def load_floats(address, code, start, step, local, out):
    n = local.shape[0]
    if code == F32:
        for i in range(n):
            out[i] = _read_f32(address + start + local[i] * step)
    else:
        for i in range(n):
            out[i] = _read_f64(address + start + local[i] * step)


@helper
def load_missing(flags, kind, first, step, local, out):
    if kind == BYTE_FLAGS:
        for i in range(local.shape[0]):
            out[i] = flags[np.uint64(first + local[i] * step)] != 0
    elif kind == BIT_FLAGS:
        for i in range(local.shape[0]):
            bit = np.uint64(first + local[i] * step)
            out[i] = (flags[bit >> np.uint64(3)] >> (bit & np.uint64(7))) & 1 != 0
    else:
        for i in range(local.shape[0]):
            out[i] = False


@helper
def load_column(data, flags, layout, c, local, ints, floats, missing, with_flags):
    """Column ``c`` at rows ``local``: into ``floats`` if it is a float column, else ``ints``; its missing flags
    too when ``with_flags``. Returns whether it is a float column."""
    code = layout[c, 0]
    size = np.int64(SIZES[code])
    address = data.ctypes.data
    if code >= F32:
        load_floats(address, code, layout[c, 1] * size, layout[c, 2] * size, local, floats)
    else:
        load_ints(address, code, layout[c, 1] * size, layout[c, 2] * size, local, ints)
    if with_flags:
        load_missing(flags, layout[c, 3], layout[c, 4], layout[c, 5], local, missing)
    return code >= F32


@kernel
def gather_columns(data, flags, layout, picks, local, positions, missing_id, label, dense, ids):
    n = local.shape[0]
    step, flag_step, flag_first, flag_bytes = records_of(layout, picks)
    if step > 0:
        gather_records(data.ctypes.data, flags.ctypes.data, layout, picks, local, positions, missing_id, label,
                       dense, ids, step, flag_step, flag_first, flag_bytes)
        return
    ints = np.empty(TILE, np.int64)
    floats = np.empty(TILE, np.float64)
    missing = np.empty(TILE, np.bool_)
    reals = np.empty(TILE, np.float32)
    factors = np.empty(2, np.float32)  # a dense value's factor by its missing flag
    factors[0], factors[1] = 1.0, NAN32
    masks = np.empty(2, np.int64)  # an id's mask of the missing id by its missing flag
    masks[0], masks[1] = 0, -1
    for first in range(0, n, TILE):  # a tile of rows at a time: its rows stay in cache across the columns
        last = min(n, first + TILE)
        m = last - first
        gather_tile(data, flags, layout, picks, local[first:last], positions[first:last], missing_id, label, dense,
                    ids, ints[:m], floats[:m], missing[:m], reals[:m], factors, masks)


def _placing(read, to_ids, name):
    """A loop that reads a column's values with ``read``, its missing bits (``BIT_FLAGS``) and writes each value,
    or the missing one, into its place in ``out``: one pass per column of a tile, for the layout converted
    tables store (each type its own loop, so that no branch on the type runs per value). Named apart as
    ``_from_records``' loops are."""
    if to_ids:
        def loop(address, start, step, flags, first, flag_step, local, positions, missing_id, out):
            for i in range(local.shape[0]):
                value = np.int64(read(address + start + local[i] * step))
                bit = np.uint64(first + local[i] * flag_step)
                gone = (flags[bit >> np.uint64(3)] >> (bit & np.uint64(7))) & 1 != 0
                out[np.uint64(positions[i])] = missing_id if gone else value
    else:
        def loop(address, start, step, flags, first, flag_step, local, positions, missing_id, out):
            for i in range(local.shape[0]):
                value = np.float32(read(address + start + local[i] * step))
                bit = np.uint64(first + local[i] * flag_step)
                gone = (flags[bit >> np.uint64(3)] >> (bit & np.uint64(7))) & 1 != 0
                out[np.uint64(positions[i])] = NAN32 if gone else value
    loop.__name__ = loop.__qualname__ = name
    return helper(loop)


_TYPES = ("u8", "i8", "u16", "i16", "u32", "i32", "i64", "f32", "f64")
_READS = (_read_u8, _read_i8, _read_u16, _read_i16, _read_u32, _read_i32, _read_i64, _read_f32, _read_f64)
_ids_u8, _ids_i8, _ids_u16, _ids_i16, _ids_u32, _ids_i32, _ids_i64 = (
    _placing(r, True, f"placing_ids_{t}") for r, t in zip(_READS[:7], _TYPES))
_dense_u8, _dense_i8, _dense_u16, _dense_i16, _dense_u32, _dense_i32, _dense_i64, _dense_f32, _dense_f64 = (
    _placing(r, False, f"placing_dense_{t}") for r, t in zip(_READS, _TYPES))


@helper
def place_ids(data, flags, layout, c, local, positions, missing_id, out):
    """Int column ``c`` (with ``BIT_FLAGS``) at rows ``local`` into ``out[positions]`` (``IDS``), in one pass."""
    code = layout[c, 0]
    size = np.int64(SIZES[code])
    args = (data.ctypes.data, layout[c, 1] * size, layout[c, 2] * size, flags, layout[c, 4], layout[c, 5], local,
            positions, missing_id, out)
    if code == U8:
        _ids_u8(*args)
    elif code == I8:
        _ids_i8(*args)
    elif code == U16:
        _ids_u16(*args)
    elif code == I16:
        _ids_i16(*args)
    elif code == U32:
        _ids_u32(*args)
    elif code == I32:
        _ids_i32(*args)
    else:
        _ids_i64(*args)


@helper
def place_dense(data, flags, layout, c, local, positions, out):
    """Column ``c`` (with ``BIT_FLAGS``) at rows ``local`` into ``out[positions]`` (``DENSE``), in one pass."""
    code = layout[c, 0]
    size = np.int64(SIZES[code])
    args = (data.ctypes.data, layout[c, 1] * size, layout[c, 2] * size, flags, layout[c, 4], layout[c, 5], local,
            positions, 0, out)
    if code == U8:
        _dense_u8(*args)
    elif code == I8:
        _dense_i8(*args)
    elif code == U16:
        _dense_u16(*args)
    elif code == I16:
        _dense_i16(*args)
    elif code == U32:
        _dense_u32(*args)
    elif code == I32:
        _dense_i32(*args)
    elif code == I64:
        _dense_i64(*args)
    elif code == F32:
        _dense_f32(*args)
    else:
        _dense_f64(*args)


def _placing_bytes(read, to_ids, name):
    """``_placing``'s loop for an integer column with ``BYTE_FLAGS`` (parsed text's row-major blocks): one pass
    reading each value and its flag byte, writing the value or the missing one in its place, without a branch
    on the flag (a dense value is multiplied by ``factors[flag]``, 1 or NaN, as ``_scaled`` does). Three passes
    and a branch per value took twice as long, four times at half the values missing. (An id is chosen through
    ``masks[flag]``, 0 or -1: LLVM turned the plain choice into a branch, loading the value only where present.)"""
    if to_ids:
        def loop(address, start, step, flags, first, flag_step, local, positions, missing_id, masks, out):
            for i in range(local.shape[0]):
                row = local[i]
                value = np.int64(read(address + start + row * step))
                mask = masks[np.uint64(flags[np.uint64(first + row * flag_step)] != 0)]
                out[np.uint64(positions[i])] = (value & ~mask) | (missing_id & mask)
    else:
        def loop(address, start, step, flags, first, flag_step, local, positions, missing_id, factors, out):
            for i in range(local.shape[0]):
                row = local[i]
                value = np.float32(read(address + start + row * step))
                gone = np.uint64(flags[np.uint64(first + row * flag_step)] != 0)
                out[np.uint64(positions[i])] = value * factors[gone]
    loop.__name__ = loop.__qualname__ = name
    return helper(loop)


_b_ids_u8, _b_ids_i8, _b_ids_u16, _b_ids_i16, _b_ids_u32, _b_ids_i32, _b_ids_i64 = (
    _placing_bytes(r, True, f"placing_bytes_ids_{t}") for r, t in zip(_READS[:7], _TYPES))
_b_dense_u8, _b_dense_i8, _b_dense_u16, _b_dense_i16, _b_dense_u32, _b_dense_i32, _b_dense_i64 = (
    _placing_bytes(r, False, f"placing_bytes_dense_{t}") for r, t in zip(_READS[:7], _TYPES))


@helper
def place_ids_bytes(data, flags, layout, c, local, positions, missing_id, masks, out):
    """Int column ``c`` (with ``BYTE_FLAGS``) at rows ``local`` into ``out[positions]`` (``IDS``), in one pass."""
    code = layout[c, 0]
    size = np.int64(SIZES[code])
    args = (data.ctypes.data, layout[c, 1] * size, layout[c, 2] * size, flags, layout[c, 4], layout[c, 5], local,
            positions, missing_id, masks, out)
    if code == U8:
        _b_ids_u8(*args)
    elif code == I8:
        _b_ids_i8(*args)
    elif code == U16:
        _b_ids_u16(*args)
    elif code == I16:
        _b_ids_i16(*args)
    elif code == U32:
        _b_ids_u32(*args)
    elif code == I32:
        _b_ids_i32(*args)
    else:
        _b_ids_i64(*args)


@helper
def place_dense_bytes(data, flags, layout, c, local, positions, factors, out):
    """Int column ``c`` (with ``BYTE_FLAGS``) at rows ``local`` into ``out[positions]`` (``DENSE``), in one pass."""
    code = layout[c, 0]
    size = np.int64(SIZES[code])
    args = (data.ctypes.data, layout[c, 1] * size, layout[c, 2] * size, flags, layout[c, 4], layout[c, 5], local,
            positions, 0, factors, out)
    if code == U8:
        _b_dense_u8(*args)
    elif code == I8:
        _b_dense_i8(*args)
    elif code == U16:
        _b_dense_u16(*args)
    elif code == I16:
        _b_dense_i16(*args)
    elif code == U32:
        _b_dense_u32(*args)
    elif code == I32:
        _b_dense_i32(*args)
    else:
        _b_dense_i64(*args)


@helper
def records_of(layout, picks):
    """(record bytes, flag bits a row, the first flag bit, flag bytes a row) of a block of row records with bit
    flags: every picked column ``BIT_FLAGS``, stepping by the same bytes (at least 8) and flag bits (a whole
    number of bytes), its flag bits within 64 of each other, and no float column sent to the ids; else zeros."""
    if picks.shape[0] == 0:
        return 0, 0, 0, 0
    first = picks[0, 0]
    step = layout[first, 2] * np.int64(SIZES[layout[first, 0]])
    flag_step = layout[first, 5]
    low = layout[first, 4]
    high = low
    for j in range(picks.shape[0]):
        c = picks[j, 0]
        if layout[c, 3] != BIT_FLAGS or layout[c, 2] * np.int64(SIZES[layout[c, 0]]) != step \
                or layout[c, 5] != flag_step or (picks[j, 1] == IDS and layout[c, 0] >= F32):
            return 0, 0, 0, 0
        low = min(low, layout[c, 4])
        high = max(high, layout[c, 4])
    low -= low % 8
    if step < 8 or flag_step % 8 != 0 or high - low >= 64:
        return 0, 0, 0, 0
    return step, flag_step, low, (high - low) // 8 + 1


@helper
def gather_records(address, flags_address, layout, picks, local, positions, missing_id, label, dense, ids, step,
                   flag_step, flag_first, flag_bytes):
    """``gather_columns`` for a block ``records_of`` describes (``address``, ``flags_address``: its buffers'
    first bytes), a tile of rows at a time."""
    n = local.shape[0]
    bases = np.empty(TILE, np.int64)
    words = np.empty(TILE, np.uint64)
    coming = 0  # rows before this have their records (and flags) on their way into L2
    for first in range(0, n, TILE):
        last = min(n, first + TILE)
        m = last - first
        while coming < min(n, first + L2_AHEAD):
            record = address + local[coming] * step
            _prefetch_l2(record)
            _prefetch_l2(record + 64)
            _prefetch_l2(record + step - 1)
            _prefetch_l2(flags_address + ((flag_first + local[coming] * flag_step) >> 3))
            coming += 1
        for i in range(m):  # each row's record address, and its flag bits from the first as one word
            row = local[first + i]
            bases[i] = address + row * step
            at = flags_address + ((flag_first + row * flag_step) >> 3)
            word = np.uint64(0)
            for b in range(flag_bytes):
                word |= np.uint64(_read_u8(at + b)) << np.uint64(8 * b)
            words[i] = word
        for i in range(last, min(n, last + TILE)):  # the next tile's records on their way meanwhile
            record = address + local[i] * step
            _prefetch(record)
            _prefetch(record + 64)
            _prefetch(record + step - 1)
        where = positions[first:last]
        for j in range(picks.shape[0]):
            records_column(layout, picks[j, 0], picks[j, 1], picks[j, 2], flag_first, bases[:m], words[:m], where,
                           missing_id, label, dense, ids)


@helper
def records_column(layout, c, target, row, flag_first, bases, words, where, missing_id, label, dense, ids):
    """Column ``c`` of the records at ``bases`` (their flag bits from ``flag_first`` in ``words``) into its
    ``target`` (``row``) at positions ``where``."""
    code = layout[c, 0]
    offset = layout[c, 1] * np.int64(SIZES[code])
    bit = np.uint64(1) << np.uint64(layout[c, 4] - flag_first)
    if target == IDS:
        records_ids(code, offset, bit, bases, words, where, missing_id, ids[row])
    elif target == DENSE:
        records_reals(code, offset, bit, bases, words, where, dense[row])
    else:  # the label: never missing
        records_reals(code, offset, np.uint64(0), bases, words, where, label)


def _from_records(read, to_ids, name):
    """A loop writing one column's value (``read`` at each record's ``offset``), or the missing one where the
    row's flag ``bit`` is set, into its place in ``out``. Each loop is named apart (``name``): numba names a
    compiled function after it, and loops of one name read from a kernel's disk cache and compiled anew would be
    taken for each other."""
    if to_ids:
        def loop(offset, bit, bases, words, where, missing_id, out):
            for i in range(bases.shape[0]):
                value = np.int64(read(bases[i] + offset))
                out[np.uint64(where[i])] = missing_id if words[i] & bit else value
    else:
        def loop(offset, bit, bases, words, where, missing_id, out):
            for i in range(bases.shape[0]):
                value = np.float32(read(bases[i] + offset))
                out[np.uint64(where[i])] = NAN32 if words[i] & bit else value
    loop.__name__ = loop.__qualname__ = name
    return helper(loop)


_rec_ids_u8, _rec_ids_i8, _rec_ids_u16, _rec_ids_i16, _rec_ids_u32, _rec_ids_i32, _rec_ids_i64 = (
    _from_records(r, True, f"records_ids_{t}") for r, t in zip(_READS[:7], _TYPES))
(_rec_reals_u8, _rec_reals_i8, _rec_reals_u16, _rec_reals_i16, _rec_reals_u32, _rec_reals_i32, _rec_reals_i64,
 _rec_reals_f32, _rec_reals_f64) = (_from_records(r, False, f"records_reals_{t}") for r, t in zip(_READS, _TYPES))


@helper
def records_ids(code, offset, bit, bases, words, where, missing_id, out):
    args = (offset, bit, bases, words, where, missing_id, out)
    if code == U8:
        _rec_ids_u8(*args)
    elif code == I8:
        _rec_ids_i8(*args)
    elif code == U16:
        _rec_ids_u16(*args)
    elif code == I16:
        _rec_ids_i16(*args)
    elif code == U32:
        _rec_ids_u32(*args)
    elif code == I32:
        _rec_ids_i32(*args)
    else:
        _rec_ids_i64(*args)


@helper
def records_reals(code, offset, bit, bases, words, where, out):
    args = (offset, bit, bases, words, where, 0, out)
    if code == U8:
        _rec_reals_u8(*args)
    elif code == I8:
        _rec_reals_i8(*args)
    elif code == U16:
        _rec_reals_u16(*args)
    elif code == I16:
        _rec_reals_i16(*args)
    elif code == U32:
        _rec_reals_u32(*args)
    elif code == I32:
        _rec_reals_i32(*args)
    elif code == I64:
        _rec_reals_i64(*args)
    elif code == F32:
        _rec_reals_f32(*args)
    else:
        _rec_reals_f64(*args)


def _in_order(read, to_ids, name):
    """A loop writing one column's value (``read`` at each record's ``offset``), or the missing one where the
    row's flag ``bit`` is set, into ``out`` in the rows' order (``gather_blocks``: a tile of the batch's
    positions, front to back). Named apart as ``_from_records``' loops are."""
    if to_ids:
        def loop(offset, bit, bases, words, start, count, missing_id, out, row):
            for i in range(count):
                value = np.int64(read(bases[np.uint64(start + i)] + offset))
                out[np.uint64(row), np.uint64(start + i)] = missing_id if words[i] & bit else value
    else:
        def loop(offset, bit, bases, words, start, count, missing_id, out, row):
            for i in range(count):
                value = np.float32(read(bases[np.uint64(start + i)] + offset))
                out[np.uint64(row), np.uint64(start + i)] = NAN32 if words[i] & bit else value
    loop.__name__ = loop.__qualname__ = name
    return helper(loop)


def _scaled(read, name):
    """``_in_order``'s loop to the dense rows for an integer column, without a branch: each value (never NaN)
    times ``factors[flag]``, 1 or NaN (x86 gives back the NaN operand: NaN32's bits exactly). LLVM makes a
    choice between two floats a branch on x86, mispredicted wherever the choice is random as missing flags are
    (a third of Criteo's dense values): 25-30% of a converted Criteo batch's gather."""
    def loop(offset, shift, bases, words, start, count, factors, out, row):
        for i in range(count):
            at = np.uint64(start + i)
            out[np.uint64(row), at] = np.float32(read(bases[at] + offset)) * factors[(words[i] >> shift) & np.uint64(1)]
    loop.__name__ = loop.__qualname__ = name
    return helper(loop)


_ord_ids_u8, _ord_ids_i8, _ord_ids_u16, _ord_ids_i16, _ord_ids_u32, _ord_ids_i32, _ord_ids_i64 = (
    _in_order(r, True, f"in_order_ids_{t}") for r, t in zip(_READS[:7], _TYPES))
_scaled_u8, _scaled_i8, _scaled_u16, _scaled_i16, _scaled_u32, _scaled_i32, _scaled_i64 = (
    _scaled(r, f"in_order_scaled_{t}") for r, t in zip(_READS[:7], _TYPES))
_ord_reals_f32, _ord_reals_f64 = (_in_order(r, False, f"in_order_reals_{t}") for r, t in zip(_READS[7:], _TYPES[7:]))


@helper
def in_order_ids(code, offset, bit, bases, words, start, count, missing_id, out, row):
    """Rows ``start..start + count`` of the batch (``bases``: their records; ``words``: the tile's flag words)
    into ``out[row]``. (Whole arrays and indices, not slices: a slice made per column and tile costs a
    reference count taken and given back, atomically, 40 times a tile.)"""
    args = (offset, bit, bases, words, start, count, missing_id, out, row)
    if code == U8:
        _ord_ids_u8(*args)
    elif code == I8:
        _ord_ids_i8(*args)
    elif code == U16:
        _ord_ids_u16(*args)
    elif code == I16:
        _ord_ids_i16(*args)
    elif code == U32:
        _ord_ids_u32(*args)
    elif code == I32:
        _ord_ids_i32(*args)
    else:
        _ord_ids_i64(*args)


@helper
def in_order_reals(code, offset, shift, bases, words, start, count, factors, out, row):
    """As ``in_order_ids``; ``factors``: 1 and NaN, or 1 and 1 for a column never missing (the label)."""
    scaled = (offset, shift, bases, words, start, count, factors, out, row)
    if code == U8:
        _scaled_u8(*scaled)
    elif code == I8:
        _scaled_i8(*scaled)
    elif code == U16:
        _scaled_u16(*scaled)
    elif code == I16:
        _scaled_i16(*scaled)
    elif code == U32:
        _scaled_u32(*scaled)
    elif code == I32:
        _scaled_i32(*scaled)
    elif code == I64:
        _scaled_i64(*scaled)
    else:  # a float column may hold NaN or -0.0, which a product would change: a choice, kept exact
        bit = np.uint64(0) if factors[1] == 1 else np.uint64(1) << shift
        if code == F32:
            _ord_reals_f32(offset, bit, bases, words, start, count, 0, out, row)
        else:
            _ord_reals_f64(offset, bit, bases, words, start, count, 0, out, row)


def _address_of(array):
    """The address of ``array``'s first byte."""
    return array.ctypes.data


try:  # (holding the GIL: a call this short gains nothing by letting it go, and would wait to take it back)
    address_of = fast_loading(numba.njit(cache=True, error_model="numpy")(_address_of))
except RuntimeError:  # numba found no writable cache location
    address_of = numba.njit(cache=False, error_model="numpy")(_address_of)


@helper
def prefetch_rows(bases, flag_at, step, first, last):
    """The records (``step`` bytes from ``bases[r]``) and flag bytes of rows ``first..last`` asked into L1."""
    for r in range(first, last):
        record = bases[r]
        _prefetch(record)
        _prefetch(record + 64)
        _prefetch(record + step - 1)
        _prefetch(flag_at[r])


@helper
def plan_records(layouts, which, picks):
    """How the blocks of groups laid out as ``layouts[which[g]]`` are read: (whether every one is a block
    ``records_of`` describes; then by group, as it describes them: record bytes, flag bits a row, first flag bit
    and flag bytes; and ``alike[j]``: whether pick ``j``'s column has the same type, place in the record and flag
    bit (from the group's first) in every group, every group's flag bytes a row being the same)."""
    groups = which.shape[0]
    steps = np.empty(groups, np.int64)
    flag_steps = np.empty(groups, np.int64)
    lows = np.empty(groups, np.int64)
    flag_bytes = np.empty(groups, np.int64)
    alike = np.zeros(picks.shape[0], np.bool_)
    same_bytes = True
    for g in range(groups):
        s, fs, lo, fb = records_of(layouts[which[g]], picks)
        if s == 0:
            return False, steps, flag_steps, lows, flag_bytes, alike
        steps[g], flag_steps[g], lows[g], flag_bytes[g] = s, fs, lo, fb
        same_bytes = same_bytes and fb == flag_bytes[0]
    ref = which[0]
    for j in range(picks.shape[0]):
        c = picks[j, 0]
        same = same_bytes
        for g in range(1, groups):
            if not same:
                break
            k = which[g]
            same = layouts[k, c, 0] == layouts[ref, c, 0] and layouts[k, c, 1] == layouts[ref, c, 1] \
                and layouts[k, c, 4] - lows[g] == layouts[ref, c, 4] - lows[0]
        alike[j] = same
    return True, steps, flag_steps, lows, flag_bytes, alike


@helper
def write_planned(bases, flag_at, order, bounds, layouts, which, steps, lows, flag_bytes, alike, picks, missing_id,
                  label, dense, ids):
    """The batch written from its rows' records (row ``i``'s at byte address ``bases[i]``, its flag bytes at
    ``flag_at[i]``) of the groups ``plan_records`` planned: the picks ``alike`` in every group in the batch's
    order (``write_records``), any other group by group (group ``g``'s rows: positions ``order[bounds[g]:
    bounds[g + 1]]``), each value read as its own block lays it out (a table cache's chunks keep each column in
    the narrowest type holding that chunk's values: one column may be uint8 in one chunk and uint16 in the
    next). The same bits either way."""
    picked = picks.shape[0]
    groups = which.shape[0]
    same = 0
    step = 0
    for j in range(picked):
        same += alike[j]
    for g in range(groups):
        step = max(step, steps[g])  # (a prefetch distance only: a line beyond a record is never read)
    if same == picked:
        write_records(bases, flag_at, layouts[which[0]], lows[0], step, flag_bytes[0], picks, missing_id, label,
                      dense, ids)
        return
    if same:
        these = np.empty((same, 3), np.int64)
        k = 0
        for j in range(picked):
            if alike[j]:
                these[k, 0], these[k, 1], these[k, 2] = picks[j, 0], picks[j, 1], picks[j, 2]
                k += 1
        write_records(bases, flag_at, layouts[which[0]], lows[0], step, flag_bytes[0], these, missing_id, label,
                      dense, ids)
    size = 0
    for g in range(groups):
        size = max(size, bounds[g + 1] - bounds[g])
    at = np.empty(size, np.int64)
    words = np.empty(size, np.uint64)
    for g in range(groups):
        layout = layouts[which[g]]
        m = bounds[g + 1] - bounds[g]
        where = order[bounds[g]:bounds[g + 1]]
        for k in range(m):  # the group's rows' records, and their flag bits from the group's first as one word
            i = where[k]
            at[k] = bases[i]
            word = np.uint64(0)
            for b in range(flag_bytes[g]):
                word |= np.uint64(_read_u8(flag_at[i] + b)) << np.uint64(8 * b)
            words[k] = word
        for j in range(picked):
            if not alike[j]:
                records_column(layout, picks[j, 0], picks[j, 1], picks[j, 2], lows[g], at[:m], words[:m], where,
                               missing_id, label, dense, ids)


@kernel
def gather_blocks(addresses, layouts, picks, bounds, local, positions, missing_id, label, dense, ids):
    """``gather_columns`` over many blocks of row records with bit flags in one pass: group ``g``'s rows (entries
    ``bounds[g]:bounds[g + 1]`` of ``local`` and ``positions``) from the block whose data and flags start at
    byte addresses ``addresses[g]`` and whose layout is ``layouts[g]``. Each row's record address and flag byte
    are found first, by position; then the batch is written in its order, a tile of positions at a time (each
    output row front to back once, where a pass per block writes all of them once per block), the records of the
    rows ``TILES_AHEAD`` tiles ahead asked into L1 meanwhile; a column whose type or place differs between the
    blocks is written group by group (``write_planned``). Returns False, writing nothing, unless every block is
    one ``records_of`` describes."""
    groups = addresses.shape[0]
    if groups == 0:
        return True
    which = np.empty(groups, np.int64)
    for g in range(groups):
        which[g] = g
    ok, steps, flag_steps, lows, flag_bytes, alike = plan_records(layouts, which, picks)
    if not ok:
        return False
    n = local.shape[0]
    bases = np.empty(n, np.int64)
    flag_at = np.empty(n, np.int64)
    for g in range(groups):
        address, flags_address, lo, step, flag_step = addresses[g, 0], addresses[g, 1], lows[g], steps[g], \
            flag_steps[g]
        for k in range(bounds[g], bounds[g + 1]):
            row = local[k]
            i = positions[k]
            bases[i] = address + row * step
            flag_at[i] = flags_address + ((lo + row * flag_step) >> 3)
    write_planned(bases, flag_at, positions, bounds, layouts, which, steps, lows, flag_bytes, alike, picks,
                  missing_id, label, dense, ids)
    return True


@kernel
def gather_table(rows, first_row, num_rows, addresses, layouts, picks, missing_id, label, dense, ids, touched):
    """``gather_blocks`` for the rows ``rows`` (global numbers, any order) of a table whose cached chunks are
    found by number: chunk ``c`` (its first row ``first_row[c]``, as ``group_by_chunk`` takes it) starts at
    byte addresses ``addresses[c]`` (data, flags; 0: not cached) with layout ``layouts[c]``. One call finds each
    row's chunk and record, checks the chunks as ``gather_blocks`` checks its blocks (the chunk of ``rows[0]``
    first, as ``gather_blocks``' first group) and writes the batch as it does (the same reads, the same bits).
    Returns the number of chunks touched (their numbers in ``touched``, in order of first appearance), or, having
    written nothing, -1 where one of them is not cached, -2 where a row is not in ``[0, num_rows)``, -3 where
    a chunk is not one of row records."""
    n = rows.shape[0]
    for i in range(n):
        if rows[i] < 0 or rows[i] >= num_rows:
            return -2
    if n == 0:
        return 0
    chunks = first_row.shape[0]
    top = 1
    while top * 2 <= chunks:
        top *= 2
    shift = power_step(first_row)
    slot = np.empty(chunks, np.int64)  # each touched chunk's place in ``touched`` (-1: not met yet)
    for c in range(chunks):
        slot[c] = -1
    group_of = np.empty(n, np.int64)
    within = np.empty(n, np.int64)
    count = 0
    for i in range(n):
        c = chunk_at(first_row, top, shift, rows[i])
        s = slot[c]
        if s < 0:
            if c >= addresses.shape[0] or c >= layouts.shape[0] or addresses[c, 0] == 0 \
                    or count == touched.shape[0]:
                return -1
            s = count
            slot[c] = s
            touched[count] = c
            count += 1
        group_of[i] = s
        within[i] = rows[i] - first_row[c]
    which = touched[:count]
    ok, steps, flag_steps, lows, flag_bytes, alike = plan_records(layouts, which, picks)
    if not ok:
        return -3
    bases = np.empty(n, np.int64)
    flag_at = np.empty(n, np.int64)
    bounds = np.zeros(count + 1, np.int64)
    for i in range(n):
        g = group_of[i]
        c = which[g]
        row = within[i]
        bases[i] = addresses[c, 0] + row * steps[g]
        flag_at[i] = addresses[c, 1] + ((lows[g] + row * flag_steps[g]) >> 3)
        bounds[g + 1] += 1
    order = within  # (reused: the positions by group, for the columns written group by group)
    for j in range(picks.shape[0]):
        if not alike[j]:
            for g in range(count):
                bounds[g + 1] += bounds[g]
            ends = np.empty(count, np.int64)
            for g in range(count):
                ends[g] = bounds[g]
            for i in range(n):
                g = group_of[i]
                order[ends[g]] = i
                ends[g] += 1
            break
    write_planned(bases, flag_at, order, bounds, layouts, which, steps, lows, flag_bytes, alike, picks, missing_id,
                  label, dense, ids)
    return count


@helper
def write_records(bases, flag_at, first, low, step, flag_bytes, picks, missing_id, label, dense, ids):
    """The batch written from its rows' records (row ``i``'s at byte address ``bases[i]``, its flag bits from
    ``low`` at ``flag_at[i]``), a tile of rows at a time, as ``gather_blocks`` describes (``first``: the layout
    the picked columns' types and places are read from)."""
    n = bases.shape[0]
    words = np.empty(BLOCK_TILE, np.uint64)
    missing = np.empty(2, np.float32)  # a value's factor by its missing flag
    missing[0], missing[1] = 1.0, NAN32
    present = np.ones(2, np.float32)
    labels = label.reshape((1, label.shape[0]))  # (a row, as the dense and id rows are)
    ahead = BLOCK_TILE * TILES_AHEAD
    prefetch_rows(bases, flag_at, step, 0, min(n, ahead))
    for start in range(0, n, BLOCK_TILE):
        stop = min(n, start + BLOCK_TILE)
        m = stop - start
        for i in range(m):  # each row's flag bits from the first, as one word
            at = flag_at[start + i]
            word = np.uint64(0)
            for b in range(flag_bytes):
                word |= np.uint64(_read_u8(at + b)) << np.uint64(8 * b)
            words[i] = word
        for j in range(picks.shape[0]):
            c, target, row = picks[j, 0], picks[j, 1], picks[j, 2]
            code = first[c, 0]
            offset = first[c, 1] * np.int64(SIZES[code])
            shift = np.uint64(first[c, 4] - low)
            # The rows ``ahead`` on their way into L1, a share in each column's pass: asked all at once at each
            # tile's start (into L2, then the next tile into L1) a converted Criteo batch took 1.07 ms instead of
            # 0.70 (one thread), likely as the core's queue of outstanding misses filled.
            share = (BLOCK_TILE + picks.shape[0] - 1) // picks.shape[0]
            prefetch_rows(bases, flag_at, step, min(n, start + ahead + j * share),
                          min(n, start + ahead + (j + 1) * share))
            if target == IDS:
                in_order_ids(code, offset, np.uint64(1) << shift, bases, words, start, m, missing_id, ids, row)
            elif target == DENSE:
                in_order_reals(code, offset, shift, bases, words, start, m, missing, dense, row)
            else:  # the label: never missing
                in_order_reals(code, offset, shift, bases, words, start, m, present, labels, 0)


@helper
def gather_tile(data, flags, layout, picks, local, positions, missing_id, label, dense, ids, ints, floats, missing,
                reals, factors, masks):
    n = local.shape[0]
    for j in range(picks.shape[0]):
        c, target, row = picks[j, 0], picks[j, 1], picks[j, 2]
        if layout[c, 3] == BIT_FLAGS and target == IDS and layout[c, 0] < F32:
            place_ids(data, flags, layout, c, local, positions, missing_id, ids[row])
            continue
        if layout[c, 3] == BIT_FLAGS and target == DENSE:
            place_dense(data, flags, layout, c, local, positions, dense[row])
            continue
        if layout[c, 3] == BYTE_FLAGS and target == IDS and layout[c, 0] < F32:
            place_ids_bytes(data, flags, layout, c, local, positions, missing_id, masks, ids[row])
            continue
        if layout[c, 3] == BYTE_FLAGS and target == DENSE and layout[c, 0] < F32:
            place_dense_bytes(data, flags, layout, c, local, positions, factors, dense[row])
            continue
        is_float = load_column(data, flags, layout, c, local, ints, floats, missing, target != LABEL)
        # Each value is loaded before the choice, so that the choice compiles to a select: missing flags are
        # random, and a branch on them would be mispredicted a third of the time. Values are first written in
        # the tile's order (a loop that vectorises), then placed.
        if target == IDS:
            for i in range(n):
                ints[i] = missing_id if missing[i] else ints[i]
            place(ints, positions, ids[row])
        elif target == DENSE:
            for i in range(n):
                v = np.float32(floats[i]) if is_float else np.float32(ints[i])
                reals[i] = NAN32 if missing[i] else v
            place(reals, positions, dense[row])
        else:
            for i in range(n):
                reals[i] = np.float32(floats[i]) if is_float else np.float32(ints[i])
            place(reals, positions, label)


@helper
def place(values, positions, out):
    """``out[positions[i]] = values[i]``; a run of consecutive positions as one copy."""
    n = values.shape[0]
    first = positions[0]
    if positions[n - 1] - first == n - 1:
        for i in range(n):
            out[first + i] = values[i]
    else:
        for i in range(n):
            out[np.uint64(positions[i])] = values[i]


@kernel
def gather_raw(data, flags, layout, int_columns, float_columns, local, ints, floats, missing):
    """Columns as they are: ``ints`` int64 [n, I], ``floats`` float64 [n, F], ``missing`` bool [n, I + F]."""
    n = local.shape[0]
    values = np.empty(n, np.int64)
    reals = np.empty(n, np.float64)
    flags_out = np.empty(n, np.bool_)
    count = int_columns.shape[0]
    for j in range(count + float_columns.shape[0]):
        c = int_columns[j] if j < count else float_columns[j - count]
        if load_column(data, flags, layout, c, local, values, reals, flags_out, True):
            for i in range(n):
                floats[i, j - count] = reals[i]
        else:
            for i in range(n):
                ints[i, j] = values[i]
        for i in range(n):
            missing[i, j] = flags_out[i]


@helper
def chunk_of(first_row, top, row):
    """The last chunk whose first row is <= ``row``: a binary search without branches (``top``: the largest
    power of two <= the number of chunks), as the rows come in random order."""
    chunks = first_row.shape[0]
    k = 0
    step = top
    while step > 0:
        j = k + step
        ok = (j < chunks) & (first_row[min(j, chunks - 1)] <= row)
        k = j if ok else k
        step >>= 1
    return k


MAPPED_CHUNKS = 4096  # up to this many chunks, a row's group is looked up in a map of every chunk


@helper
def power_step(first_row):
    """``k`` where every chunk but the last holds ``2**k`` rows (chunk ``c`` starts at ``c << k``), else -1."""
    chunks = first_row.shape[0]
    if chunks < 2 or first_row[1] <= 0:
        return -1
    step = first_row[1]
    shift = 0
    while (np.int64(1) << shift) < step:
        shift += 1
    if (np.int64(1) << shift) != step:
        return -1
    for c in range(chunks):
        if first_row[c] != c * step:
            return -1
    return shift


@helper
def chunk_at(first_row, top, shift, row):
    """The chunk holding ``row``: a shift where ``power_step`` found one, else a search."""
    if shift >= 0:
        return min(row >> shift, first_row.shape[0] - 1)
    return chunk_of(first_row, top, row)


@kernel
def group_by_chunk(rows, first_row, num_rows, chunks, bounds, local, positions):
    """Rows grouped by the chunk holding them (``first_row``: each chunk's first row, increasing), in order of
    first appearance, each group keeping the rows' order: ``chunks[g]`` is group g's chunk, its rows
    ``bounds[g]:bounds[g + 1]`` of ``local`` (row within the chunk) and ``positions`` (index into ``rows``).
    Returns the number of groups, -1 when more than ``chunks.shape[0]`` chunks are met, -2 when a row is not
    in ``[0, num_rows)``."""
    n = rows.shape[0]
    for i in range(n):
        if rows[i] < 0 or rows[i] >= num_rows:
            return -2
    slot = np.empty(n, np.int64)
    counts = np.zeros(chunks.shape[0] + 1, np.int64)
    groups = 0
    last = -1
    last_slot = 0
    top = 1
    while top * 2 <= first_row.shape[0]:
        top *= 2
    shift = power_step(first_row)
    # A map of each chunk's group where there are few chunks (rows of a shuffle buffer-full come from its
    # chunks at random: a search of the groups met would mispredict at almost every row).
    mapped = first_row.shape[0] <= MAPPED_CHUNKS
    group_of = np.full(first_row.shape[0] if mapped else 0, -1, np.int64)
    for i in range(n):
        c = chunk_at(first_row, top, shift, rows[i])
        if c != last:
            if mapped:
                s = group_of[c]
                if s < 0:
                    s = groups
            else:
                s = 0
                while s < groups and chunks[s] != c:
                    s += 1
            if s == groups:
                if groups == chunks.shape[0]:
                    return -1
                chunks[s] = c
                if mapped:
                    group_of[c] = s
                groups += 1
            last, last_slot = c, s
        slot[i] = last_slot
        counts[last_slot + 1] += 1
    for g in range(groups):
        counts[g + 1] += counts[g]
    for g in range(groups + 1):
        bounds[g] = counts[g]
    for i in range(n):
        s = slot[i]
        k = counts[s]
        counts[s] = k + 1
        local[k] = rows[i] - first_row[chunks[s]]
        positions[k] = i
    return groups


@kernel
def touched_chunks(rows, first_row, num_rows, out):
    """The chunks holding one of ``rows`` (``first_row`` as ``group_by_chunk`` takes it), increasing, into ``out``
    (int64 [>= chunks]); returns how many, or -1, writing nothing, when a row is not in ``[0, num_rows)``."""
    n = rows.shape[0]
    for i in range(n):
        if rows[i] < 0 or rows[i] >= num_rows:
            return -1
    chunks = first_row.shape[0]
    marks = np.zeros(chunks, np.bool_)
    top = 1
    while top * 2 <= chunks:
        top *= 2
    shift = power_step(first_row)
    for i in range(n):
        marks[chunk_at(first_row, top, shift, rows[i])] = True
    count = 0
    for c in range(chunks):
        if marks[c]:
            out[count] = c
            count += 1
    return count
