"""The Handle and TablesHandle docstrings are one text (csrc/python/bind_handle.cc): each
method of a multi-table pull's handle says what the one-table handle's says, per table."""

from __future__ import annotations

import re

import pytest

from cpu_dist.sparse import _ps_client


@pytest.mark.parametrize("method", ["committed_step", "row_steps", "row_states"])
def test_tables_handle_says_what_handle_says_per_table(method):
    one = getattr(_ps_client.Handle, method).__doc__
    many = getattr(_ps_client.TablesHandle, method).__doc__
    # pybind11 puts the signature first: compare the text after it
    one, many = (d.split("\n", 1)[1].strip() for d in (one, many))
    assert re.sub(r"\{table: (.*?)\}(?=[,.])", r"\1", many) == one


def test_both_handles_wait_alike():
    tail = "Raises PSError on failure, TimeoutError on timeout."
    for cls in (_ps_client.Handle, _ps_client.TablesHandle):
        assert cls.wait.__doc__.rstrip().endswith(tail)
