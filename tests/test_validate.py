"""The shared argument checks: what each accepts, what it returns, and that its error names the argument."""
import math

import numpy as np
import pytest

from feedline.pipelines import validate


@pytest.mark.parametrize("value", [1, 7, np.int64(3), np.uint8(1)])
def test_positive_int_takes_integers_and_returns_plain_ints(value):
    got = validate.positive_int("batch_size", value)
    assert got == int(value) and type(got) is int


@pytest.mark.parametrize("value", [0, -1, True, np.bool_(True), 2.0, "4", None])
def test_positive_int_names_the_argument(value):
    with pytest.raises(ValueError, match=rf"batch_size must be a positive integer, got {value!r}"):
        validate.positive_int("batch_size", value)


def test_ranges_and_numbers():
    assert validate.int_at_least("epoch", 0, 0) == 0
    with pytest.raises(ValueError, match=r"epoch must be an integer >= 0, got -1"):
        validate.int_at_least("epoch", -1, 0)
    assert validate.int_in("size", 8, 8, 8192) == 8
    with pytest.raises(ValueError, match=r"size must be an integer in \[8, 8192\], got 8193"):
        validate.int_in("size", 8193, 8, 8192)
    assert validate.optional_positive_int("n", None) is None
    assert validate.finite_at_least("share", np.float32(0.5), 0.0) == 0.5
    for bad in (math.inf, math.nan, -0.1, True):
        with pytest.raises(ValueError, match="share must be a finite number >= 0.0"):
            validate.finite_at_least("share", bad, 0.0)
    assert validate.positive_seconds("timeout_s", 2) == 2.0
    with pytest.raises(ValueError, match="timeout_s must be a positive, finite number of seconds, got 0"):
        validate.positive_seconds("timeout_s", 0)


def test_flags_and_choices():
    assert validate.flag("shuffle", np.bool_(False)) is False
    with pytest.raises(TypeError, match="shuffle must be True or False, got 1"):
        validate.flag("shuffle", 1)
    assert validate.one_of("last_batch", "pad", ("partial", "drop", "pad")) == "pad"
    with pytest.raises(ValueError, match=r"last_batch must be one of 'partial', 'drop', 'pad', got 'Pad'"):
        validate.one_of("last_batch", "Pad", ("partial", "drop", "pad"))
