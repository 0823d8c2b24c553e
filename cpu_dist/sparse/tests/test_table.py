"""Pull/push semantics against the numpy reference: first-touch rows, optimizers,
duplicates, client-side splitting, dump."""

import time

import numpy as np
import pytest

from cpu_dist.common import contracts

from .conftest import rng_grads
from .reference import RefTable

pytestmark = pytest.mark.timeout(60)


def bits_equal(a, b):
    return a.shape == b.shape and np.array_equal(
        np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32)
    )


def test_pull_absent_rows_is_row_init_and_does_not_grow(cluster_factory):
    c = cluster_factory(num_shards=1, dim=16, seed=11, init_scale=0.5)
    cl = c.client()
    keys = np.array([5, -3, 2**62, 0, 77], dtype=np.int64)
    got = cl.pull(keys)
    assert got.dtype == np.float32 and got.shape == (5, 16)
    assert bits_equal(got, contracts.row_init(11, keys, 16, 0.5))
    assert c.rows() == 0
    assert cl.stats()[0]["rows"] == 0
    assert cl.pull(np.zeros(0, np.int64)).shape == (0, 16)


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_push_matches_numpy(cluster_factory, optimizer):
    c = cluster_factory(num_shards=1, dim=8)
    cl = c.client()
    ref = RefTable(8, c.seed, c.init_scale)
    rng = np.random.default_rng(0)
    for step in range(5):
        keys = rng.integers(0, 40, 30).astype(np.int64)  # with duplicates
        grads = rng_grads(rng, 30, 8)
        cl.push(keys, grads, 0.05 * (step + 1), optimizer)
        ref.push(keys, grads, 0.05 * (step + 1), optimizer)
    k, v, s = cl.dump()
    rk, rv, rs = ref.dump()
    assert np.array_equal(k, rk)
    assert bits_equal(v, rv)
    assert bits_equal(s, rs)
    probe = np.arange(-5, 45, dtype=np.int64)
    assert bits_equal(cl.pull(probe), np.stack([ref.get(int(x)) for x in probe]))
    if optimizer == "sgd":
        assert np.all(s == 0)
    else:
        assert np.all(s > 0)


def test_duplicates_in_pull_and_push(cluster_factory):
    c = cluster_factory(num_shards=2, dim=4)
    cl = c.client()
    keys = np.array([9, 9, 3, 9, 3], dtype=np.int64)
    rows = cl.pull(keys)
    assert bits_equal(rows[0], rows[1]) and bits_equal(rows[0], rows[3])
    assert bits_equal(rows[2], rows[4])
    grads = np.arange(20, dtype=np.float32).reshape(5, 4)
    before = cl.pull(np.array([9, 3], dtype=np.int64))
    cl.push(keys, grads, 1.0)
    after = cl.pull(np.array([9, 3], dtype=np.int64))
    assert bits_equal(after[0], before[0] - ((grads[0] + grads[1]) + grads[3]))
    assert bits_equal(after[1], before[1] - (grads[2] + grads[4]))
    assert c.rows() == 2
    # Sorted with repeats (not strictly increasing): still the duplicate path, same rows;
    # strictly increasing keys: the rows of those keys, in order.
    sorted_dups = cl.pull(np.array([3, 3, 9, 9, 9], dtype=np.int64))
    assert bits_equal(sorted_dups[0], after[1]) and bits_equal(sorted_dups[1], after[1])
    assert all(bits_equal(sorted_dups[i], after[0]) for i in (2, 3, 4))
    increasing = cl.pull(np.array([3, 9], dtype=np.int64))
    assert bits_equal(increasing[0], after[1]) and bits_equal(increasing[1], after[0])


@pytest.mark.parametrize("num_shards", [2, 3])
def test_client_splitting_gives_same_answers(cluster_factory, num_shards):
    rng = np.random.default_rng(num_shards)
    keys = rng.integers(-1000, 1000, 200).astype(np.int64)
    grads = rng_grads(rng, 200, 8)
    results = []
    for max_keys, channels in [(8192, 1), (3, 2), (3, 3)]:
        c = cluster_factory(num_shards=num_shards, dim=8)
        cl = c.client(max_keys_per_rpc=max_keys, channels_per_shard=channels)
        first = cl.pull(keys)
        cl.push(keys, grads, 0.1, "rowwise_adagrad")
        cl.push(keys[::-1].copy(), grads, 0.2, "sgd")
        results.append((first, cl.pull(keys), cl.dump()))
        shard_rows = [s.stats()["rows"] for s in c.servers]
        assert all(r > 0 for r in shard_rows)
    for first, pulled, (k, v, s) in results[1:]:
        assert bits_equal(first, results[0][0])
        assert bits_equal(pulled, results[0][1])
        assert np.array_equal(k, results[0][2][0])
        assert bits_equal(v, results[0][2][1]) and bits_equal(s, results[0][2][2])


def test_shards_hold_their_partition(cluster_factory):
    c = cluster_factory(num_shards=3, dim=4)
    cl = c.client()
    keys = np.arange(300, dtype=np.int64)
    cl.push(keys, np.ones((300, 4), np.float32), 0.1)
    want = np.bincount(contracts.shard_of(keys, 3), minlength=3)
    assert [s.stats()["rows"] for s in c.servers] == want.tolist()


def test_large_pull_split_over_channels(cluster_factory):
    c = cluster_factory(num_shards=1, dim=64)
    cl = c.client(channels_per_shard=2)
    keys = np.arange(5000, dtype=np.int64) * 7
    cl.push(keys, np.ones((5000, 64), np.float32), 0.5)
    out = np.empty((5000, 64), np.float32)
    res = cl.pull(keys, out=out)
    assert res is out or np.shares_memory(res, out)
    assert bits_equal(out, contracts.row_init(c.seed, keys, 64, c.init_scale) - np.float32(0.5))
    st = cl.stats()[0]
    assert st["pull_calls"] == 2 and st["pull_keys"] == 5000


def test_async_push_and_handle(cluster_factory):
    c = cluster_factory(num_shards=2, dim=4)
    cl = c.client()
    keys = np.arange(10, dtype=np.int64)
    h = cl.push_async(keys, np.ones((10, 4), np.float32), 1.0)
    h.wait(10.0)
    assert h.done()
    assert c.rows() == 10
    h2 = cl.push_async(np.zeros(0, np.int64), np.zeros((0, 4), np.float32), 1.0)
    h2.wait()
    assert h2.done()


def test_python_argument_errors(cluster_factory):
    c = cluster_factory(num_shards=1, dim=4)
    cl = c.client()
    k = np.arange(3, dtype=np.int64)
    with pytest.raises(ValueError, match="keys"):
        cl.pull(np.zeros((2, 2), np.int64))
    with pytest.raises(ValueError, match="grads"):
        cl.push(k, np.zeros((2, 4), np.float32), 0.1)
    with pytest.raises(ValueError, match="grads"):
        cl.push(k, np.zeros((3, 5), np.float32), 0.1)
    with pytest.raises(ValueError, match="optimizer"):
        cl.push(k, np.zeros((3, 4), np.float32), 0.1, "adam")
    with pytest.raises(ValueError, match="lr"):
        cl.push(k, np.zeros((3, 4), np.float32), float("nan"))
    with pytest.raises(ValueError, match="out"):
        cl.pull(k, out=np.zeros((3, 4), np.float64))
    # Wrong dtype / non-contiguous input is converted.
    cl.push(k.astype(np.int32), np.zeros((4, 3), np.float64).T, 0.1)
    cl.pull(np.arange(6, dtype=np.int64)[::2])
    assert c.rows() == 3


def _blocks_ahead(cl) -> int:
    return sum(t["blocks_ahead"] for shard in cl.stats() for t in shard["tables"])


def test_growing_stripes_get_their_next_blocks_faulted_in_ahead_and_rows_stay_exact(
    cluster_factory,
):
    """A stripe past half its block has its next block faulted in on the table's own thread
    (grow_ahead.h); rows written into such blocks are the reference's, bit for bit."""
    c = cluster_factory(num_shards=1, dim=8)
    cl = c.client()
    ref = RefTable(8, c.seed, c.init_scale)
    rng = np.random.default_rng(3)

    def push(keys):
        grads = rng_grads(rng, len(keys), 8)
        cl.push(keys, grads, 0.1, "sgd")
        ref.push(keys, grads, 0.1, "sgd")

    # 16 stripes of about 375 rows: each ends in its block 2 (rows 192-447), past half of it,
    # so each asks for block 3 after its last insert and nothing takes that block before the
    # delivery (an ask made mid-push may lose that race, and its block is dropped: by design).
    push(np.arange(6000, dtype=np.int64))
    deadline = time.monotonic() + 30.0
    while _blocks_ahead(cl) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # the faulting thread files blocks on its own
    assert _blocks_ahead(cl) > 0
    for start in range(6000, 42000, 4000):  # into the blocks filed ahead, and past them
        push(np.arange(start, start + 4000, dtype=np.int64))
    push(rng.integers(0, 42000, 3000).astype(np.int64))  # rows of every block again
    k, v, _ = cl.dump()
    rk, rv, _ = ref.dump()
    assert np.array_equal(k, rk) and bits_equal(v, rv)
