"""Fused keys back to each table's keys (job files): Criteo, synthetic, num_embeddings,
features that share a table, and the default job's fused table."""

from types import SimpleNamespace

import numpy as np
import pytest

from cpu_dist.data.keys import (
    TableKeySplit,
    fuse_criteo_columns,
    fuse_synthetic,
    synthetic_offsets,
    table_keys,
)

pytestmark = pytest.mark.timeout(30)

NAMES = ["cat_0", "cat_1", "cat_2"]


def _table(name, features, num_embeddings=0):
    return SimpleNamespace(name=name, features=tuple(features), num_embeddings=num_embeddings)


def test_criteo_tables_take_each_features_raw_value_and_shared_tables_share_ids():
    raw = np.array([[7, 7, 0xFFFFFFFF], [3, 9, 5]], dtype=np.uint32)
    fused = fuse_criteo_columns(raw, [2**32] * 3)
    got = table_keys(fused, [_table("t", ["cat_1", "cat_0"]), _table("u", ["cat_2"], 4)], NAMES)
    assert list(got) == ["t", "u"]
    # the table's columns in its feature order; the same id in two features is the same key
    np.testing.assert_array_equal(got["t"], [[7, 7], [9, 3]])
    np.testing.assert_array_equal(got["u"], [[0xFFFFFFFF % 4], [5 % 4]])
    assert got["t"].dtype == np.int64 and got["t"].flags.c_contiguous


def test_synthetic_tables_take_the_id_below_the_offset():
    offsets = synthetic_offsets([10, 20, 30])
    ids = np.array([[1, 2, 3], [9, 19, 29]], dtype=np.int64)
    got = table_keys(fuse_synthetic(ids, offsets), [_table("all", NAMES, 5)], NAMES, offsets)
    np.testing.assert_array_equal(got["all"], ids % 5)


def test_the_default_job_keeps_its_fused_keys_unchanged():
    fused = fuse_criteo_columns(np.array([[1, 2, 3]], dtype=np.uint32), [2**32] * 3)
    split = TableKeySplit({"embedding": range(3)}, fused=True)
    assert split(fused)["embedding"] is fused


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ([_table("a", ["cat_0", "cat_1"]), _table("b", ["cat_1", "cat_2"])], "in tables"),
        ([_table("a", ["cat_0", "nope"])], "'nope' is not a feature"),
        ([_table("a", ["cat_0", "cat_2"])], "are not 0..F-1"),
    ],
)
def test_bad_tables_are_named(tables, message):
    with pytest.raises(ValueError, match=message):
        TableKeySplit.for_tables(tables, NAMES)


def test_wrong_key_width_is_refused():
    split = TableKeySplit.for_tables([_table("a", NAMES)], NAMES)
    with pytest.raises(ValueError, match=r"expected \[B, 3\]"):
        split(np.zeros((2, 2), dtype=np.int64))
