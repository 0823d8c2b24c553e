"""The --dump-state layout (cpu_dist/train/dump.py): dense/<name> and, per table,
table/<name>/keys (int64, sorted) and table/<name>/values (float32 [n, dim])."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpu_dist.common.files import is_state_dump
from cpu_dist.train.dump import model_arrays, table_rows, write_dump


class TwoParams(torch.nn.Module):
    """A model's dense part: ``top.0.weight`` float32 and ``top.0.bias`` float64."""

    def __init__(self) -> None:
        super().__init__()
        self.top = torch.nn.ModuleList([torch.nn.Linear(3, 2)])
        with torch.no_grad():
            self.top[0].weight = torch.nn.Parameter(
                torch.arange(6, dtype=torch.float32).reshape(2, 3)
            )
            self.top[0].bias = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))


def test_every_table_is_named_sorted_and_typed(tmp_path):
    small = (np.array([9, -3, 4], np.int64), np.arange(12, dtype=np.float64).reshape(3, 4))
    wide = (np.array([1], np.int32), np.ones((1, 16), np.float32))
    arrays = model_arrays(TwoParams(), {"small": small, "wide": wide})
    assert sorted(arrays) == [
        "dense/top.0.bias",
        "dense/top.0.weight",
        "table/small/keys",
        "table/small/values",
        "table/wide/keys",
        "table/wide/values",
    ]
    assert arrays["dense/top.0.bias"].dtype == np.float64  # the model's dtype
    np.testing.assert_array_equal(arrays["table/small/keys"], [-3, 4, 9])
    assert arrays["table/small/keys"].dtype == np.int64
    values = arrays["table/small/values"]
    assert values.dtype == np.float32 and values.shape == (3, 4)
    np.testing.assert_array_equal(values[0], small[1][1])  # rows follow their keys
    assert arrays["table/wide/values"].shape == (1, 16)
    path = tmp_path / "m.npz"
    write_dump(str(path), arrays)
    assert is_state_dump(path)
    with np.load(path) as z:
        back = table_rows(z)
        assert list(back) == ["small", "wide"]
        np.testing.assert_array_equal(back["small"][0], [-3, 4, 9])
        np.testing.assert_array_equal(back["wide"][1], wide[1])


def test_rows_that_do_not_match_their_keys_are_refused():
    with pytest.raises(ValueError, match="table 'x': 2 keys but values of shape"):
        model_arrays(TwoParams(), {"x": (np.zeros(2, np.int64), np.zeros((3, 4), np.float32))})
