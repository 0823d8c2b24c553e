"""The suite's one comparison of two ``--dump-state`` dicts (launch.py) fails where a private
copy of it was weaker: a second table's keys, a signed zero, a dtype.  No job runs here."""

from __future__ import annotations

import numpy as np
import pytest

from .launch import assert_dumps_close, assert_dumps_equal


def dump() -> dict[str, np.ndarray]:
    """Two tables and a dense parameter, as a job's dump names them."""
    return {
        "dense/top.0.weight": np.array([[0.5, -0.25]], dtype=np.float32),
        "table/a/keys": np.array([1, 7], dtype=np.int64),
        "table/a/values": np.array([[0.1], [0.2]], dtype=np.float32),
        "table/b/keys": np.array([3, 9], dtype=np.int64),
        "table/b/values": np.array([[0.3], [0.4]], dtype=np.float32),
    }


def test_the_same_dump_passes_both():
    assert_dumps_equal(dump(), dump(), "same")
    assert_dumps_close(dump(), dump(), 1e-5, "same")


def test_any_tables_keys_must_be_equal_not_only_close():
    """Keys 9 and 10 are close to rtol 0.2, but a row's id is not a value (the old private
    helpers checked one table's keys, ``table/embedding``, or none)."""
    got = dump()
    got["table/b/keys"] = np.array([3, 10], dtype=np.int64)
    with pytest.raises(AssertionError, match="b"):
        assert_dumps_close(got, dump(), 0.2, "keys")


def test_values_beyond_the_tolerance_fail_and_atol_is_the_callers():
    got = dump()
    got["table/a/values"] = got["table/a/values"] + np.float32(1e-4)
    with pytest.raises(AssertionError, match="table/a/values"):
        assert_dumps_close(got, dump(), 1e-5, "values")
    assert_dumps_close(got, dump(), 1e-5, "values", atol=2e-4)


def test_an_entry_one_side_lacks_fails():
    got = dump()
    del got["dense/top.0.weight"]
    with pytest.raises(AssertionError, match="different entries"):
        assert_dumps_close(got, dump(), 1e-5, "entries")
    with pytest.raises(AssertionError, match="different entries"):
        assert_dumps_equal(got, dump(), "entries")


def test_bit_for_bit_sees_a_signed_zero_and_a_dtype_that_values_hide():
    zero, minus = dump(), dump()
    zero["dense/top.0.weight"][0, 0] = 0.0
    minus["dense/top.0.weight"][0, 0] = -0.0
    assert_dumps_close(minus, zero, 0.0, "signed zero", atol=0.0)
    with pytest.raises(AssertionError, match="different bits"):
        assert_dumps_equal(minus, zero, "signed zero")
    wide = dump()
    wide["table/a/values"] = wide["table/a/values"].astype(np.float64)
    with pytest.raises(AssertionError, match="float64"):
        assert_dumps_equal(wide, dump(), "dtype")


def test_two_empty_dumps_are_no_comparison():
    with pytest.raises(AssertionError, match="no arrays"):
        assert_dumps_equal({}, {}, "empty")
