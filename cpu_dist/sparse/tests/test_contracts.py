"""The native hash contracts equal their numpy twins bit for bit."""

import numpy as np
import pytest

from cpu_dist.common import contracts
from cpu_dist.sparse import NUM_PARTITIONS, partition_of, row_init

EDGE_KEYS = np.array([0, 1, -1, 2**63 - 1, -(2**63), 123456789, -987654321], dtype=np.int64)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("seed", [0, 1, 2**64 - 1, 0xDEADBEEF])
@pytest.mark.parametrize("scale", [1.0, 0.01, 3.5])
def test_row_init_matches_numpy(seed, scale):
    rng = np.random.default_rng(seed % 1000)
    keys = np.concatenate([EDGE_KEYS, rng.integers(-(2**63), 2**63 - 1, 500, dtype=np.int64)])
    a = row_init(seed, keys, 64, scale)
    b = contracts.row_init(seed, keys, 64, scale)
    assert a.dtype == np.float32 and a.shape == (keys.size, 64)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert np.all(np.abs(a) <= scale)


@pytest.mark.timeout(30)
def test_partition_of_matches_numpy():
    rng = np.random.default_rng(3)
    keys = np.concatenate([EDGE_KEYS, rng.integers(-(2**63), 2**63 - 1, 20000, dtype=np.int64)])
    a = partition_of(keys)
    b = contracts.partition_of(keys)
    assert np.array_equal(a, b)
    assert a.min() >= 0 and a.max() < NUM_PARTITIONS
    # Spread: every partition is hit by 20000 random keys with overwhelming probability.
    assert np.unique(a).size > NUM_PARTITIONS * 0.95
