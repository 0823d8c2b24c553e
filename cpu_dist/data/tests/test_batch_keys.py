"""Batch slicing and the fused-key layouts."""

import numpy as np
import pytest

from cpu_dist.common.sorted_keys import find_sorted
from cpu_dist.data import Batch, fuse_criteo, fuse_synthetic, synthetic_offsets
from cpu_dist.data.batch import Bags
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


def _bagged(b: int = 6) -> Batch:
    lengths = np.array([2, 0, 3, 1, 0, 4][:b], np.int64)
    n = int(lengths.sum())
    plain = _batch(b)
    return Batch(
        dense=plain.dense,
        keys=plain.keys,
        labels=plain.labels,
        bags={
            "cat_1": Bags(lengths, np.arange(100, 100 + n, dtype=np.int64)),
            "cat_5": Bags(
                np.ones(b, np.int64),
                np.arange(b, dtype=np.int64),
                np.linspace(0.5, 1.5, b, dtype=np.float32),
            ),
        },
    )


def test_rows_cut_every_features_bags_with_the_samples():
    b = _bagged()
    part = b.rows(2, 5)
    assert len(part) == 3 and sorted(part.bags) == ["cat_1", "cat_5"]
    np.testing.assert_array_equal(part.keys, b.keys[2:5])
    np.testing.assert_array_equal(part.bags["cat_1"].lengths, [3, 1, 0])
    np.testing.assert_array_equal(part.bags["cat_1"].values, [102, 103, 104, 105])
    np.testing.assert_array_equal(part.bags["cat_5"].weights, b.bags["cat_5"].weights[2:5])
    np.testing.assert_array_equal(b.rows(1, 2).bags["cat_1"].values, np.zeros(0, np.int64))
    np.testing.assert_array_equal(b.rows(0, 6).bags["cat_1"].values, b.bags["cat_1"].values)
    np.testing.assert_array_equal(b.bags["cat_1"].offsets, [0, 2, 2, 5, 6, 6, 10])
    for lo, hi in [(-1, 2), (3, 2), (0, 7)]:
        with pytest.raises(ValueError, match="bad row span"):
            b.rows(lo, hi)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_shards_concatenate_to_the_batch_bags_included(world):
    b = _bagged()
    parts = [b.shard(r, world) for r in range(world)]
    for name, bag in b.bags.items():
        for field in ("lengths", "values", "weights"):
            if getattr(bag, field) is None:
                assert all(getattr(p.bags[name], field) is None for p in parts)
                continue
            got = np.concatenate([getattr(p.bags[name], field) for p in parts])
            np.testing.assert_array_equal(got, getattr(bag, field))


@pytest.mark.parametrize(
    "lengths,values,weights,match",
    [
        (np.array([1, 1], np.int32), np.zeros(2, np.int64), None, "lengths must be int64"),
        (np.array([1, -1], np.int64), np.zeros(0, np.int64), None, "lengths must be >= 0"),
        (np.array([1, 2], np.int64), np.zeros(2, np.int64), None, "2 ids, the lengths add up to 3"),
        (np.array([1, 2], np.int64), np.zeros(3, np.float64), None, "values must be int64"),
        (
            np.array([1, 2], np.int64),
            np.zeros(3, np.int64),
            np.ones(2, np.float32),
            "weights has 2",
        ),
        (np.array([1, 2], np.int64), np.zeros(3, np.int64), np.ones(3), "weights must be float32"),
        ([1, 2], np.zeros(3, np.int64), None, "lengths must be a numpy array"),
    ],
)
def test_bags_reject_bad_arrays(lengths, values, weights, match):
    with pytest.raises(ValueError, match=match):
        Bags(lengths, values, weights)


def test_batch_rejects_bags_of_another_size():
    plain = _batch(4)
    with pytest.raises(ValueError, match="'cat_2' has bags for 3 samples, batch has 4"):
        Batch(
            plain.dense,
            plain.keys,
            plain.labels,
            bags={"cat_2": Bags(np.ones(3, np.int64), np.zeros(3, np.int64))},
        )
    with pytest.raises(ValueError, match="maps feature names to Bags"):
        Batch(plain.dense, plain.keys, plain.labels, bags={"cat_2": np.ones(4, np.int64)})
    assert dict(plain.bags) == {} and dict(plain.shard(1, 2).bags) == {}


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
