"""Batch slicing and the fused-key layouts."""

import numpy as np
import pytest

from cpu_dist.common.sorted_keys import find_sorted
from cpu_dist.data import Batch, fuse_criteo, fuse_synthetic, synthetic_offsets
from cpu_dist.data.keys import check_criteo_hash_size, criteo_feature_of

pytestmark = pytest.mark.timeout(30)


def _batch(b: int = 8) -> Batch:
    return Batch(
        dense=np.arange(b * 13, dtype=np.float32).reshape(b, 13),
        keys=np.arange(b * 26, dtype=np.int64).reshape(b, 26),
        labels=(np.arange(b) % 2).astype(np.float32),
    )


def test_shards_are_contiguous_and_concatenate_to_the_batch():
    b = _batch(8)
    parts = [b.shard(r, 4) for r in range(4)]
    assert [len(p) for p in parts] == [2, 2, 2, 2]
    np.testing.assert_array_equal(parts[1].keys, b.keys[2:4])
    np.testing.assert_array_equal(np.concatenate([p.dense for p in parts]), b.dense)
    np.testing.assert_array_equal(np.concatenate([p.labels for p in parts]), b.labels)
    np.testing.assert_array_equal(b.shard(0, 1).keys, b.keys)


@pytest.mark.parametrize("rank,world", [(0, 3), (4, 4), (-1, 4), (0, 0)])
def test_shard_rejects_uneven_or_bad_rank(rank, world):
    with pytest.raises(ValueError):
        _batch(8).shard(rank, world)


def test_batch_rejects_mismatched_sizes():
    with pytest.raises(ValueError):
        Batch(
            dense=np.zeros((3, 13), np.float32),
            keys=np.zeros((4, 26), np.int64),
            labels=np.zeros(3, np.float32),
        )


def test_synthetic_keys_are_offset_by_cumulative_cardinalities():
    offsets = synthetic_offsets([3, 5, 2])
    np.testing.assert_array_equal(offsets, [0, 3, 8])
    keys = fuse_synthetic(np.array([[2, 4, 1], [0, 0, 0]]), offsets)
    np.testing.assert_array_equal(keys, [[2, 7, 9], [0, 3, 8]])
    assert keys.dtype == np.int64
    with pytest.raises(ValueError):
        synthetic_offsets([3, 0])


def test_criteo_keys_put_the_feature_in_the_high_bits():
    assert fuse_criteo(0, 0x05DB9164) == 0x05DB9164
    assert fuse_criteo(25, 0xFFFFFFFF) == (25 << 32) | 0xFFFFFFFF
    assert fuse_criteo(3, 1000, hash_size=7) == (3 << 32) | (1000 % 7)
    arr = fuse_criteo(np.array([1, 2]), np.array([5, 0xABCDEF01]))
    np.testing.assert_array_equal(arr, [(1 << 32) | 5, (2 << 32) | 0xABCDEF01])
    np.testing.assert_array_equal(criteo_feature_of(arr), [1, 2])
    with pytest.raises(ValueError):
        check_criteo_hash_size(2**32 + 1)
    with pytest.raises(ValueError):
        check_criteo_hash_size(0)


def test_find_sorted_positions_and_membership():
    at, found = find_sorted(
        np.array([2, 5, 9], dtype=np.int64), np.array([1, 2, 6, 9, 12], dtype=np.int64)
    )
    assert found.tolist() == [False, True, False, True, False]
    assert at[found].tolist() == [0, 2]
    _, none = find_sorted(np.zeros(0, dtype=np.int64), np.array([3], dtype=np.int64))
    assert none.tolist() == [False]
