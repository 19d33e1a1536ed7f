"""text_columns, the one layout of the plan and profile tables: columns as wide as their widest cell, numeric ones
to the right, a rule under the headings; with free_last the last column is left as it comes."""
from __future__ import annotations

from feedline.loader.placement.units import format_bytes, text_columns

ROWS = [("stage", "ms", "why"), ("decode", "12.5", "the CPU is free"), ("crop", "3", "")]


def test_every_column_padded():
    assert text_columns(ROWS, {1}) == [
        "stage     ms  why",
        "------  ----  ---------------",
        "decode  12.5  the CPU is free",
        "crop       3",
    ]


def test_the_last_column_left_free():
    assert text_columns(ROWS, {1}, free_last=True) == [
        "stage     ms  why",
        "------  ----  ---",
        "decode  12.5  the CPU is free",
        "crop       3",
    ]


def test_bytes_in_the_largest_unit_they_reach():
    assert [format_bytes(n) for n in (0, 1023, 1024, 1536, 2 ** 20 - 1, 3 * 2 ** 30)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "1024.0 KiB", "3.0 GiB"]
