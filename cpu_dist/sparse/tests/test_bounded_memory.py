"""Bounded memory on every path of a shard: the pending step's bytes, gradients being decoded,
SSD-tier failures that must not be swallowed (the DRAM tier growing past its budget) nor
misreported (a step applied, then its expiry failing), and apply_rows on a copy."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_dist.sparse import PSError, _ps

from .conftest import rng_grads

pytestmark = pytest.mark.timeout(120)

DIM = 8


def test_the_pending_steps_chunks_are_byte_capped_and_fail_the_session(cluster_factory):
    keys = np.arange(100, dtype=np.int64)
    chunk = len(keys) * (8 + 4 * DIM)  # key and float32 row bytes a chunk stores
    cl = cluster_factory(1, DIM, max_pending_bytes=2 * chunk).client()
    g = np.ones((len(keys), DIM), np.float32)
    for rank in range(2):  # two of three ranks: at the cap exactly
        cl.commit(1, 0, rank, 3, keys, g, 0.1, "sgd")
    with pytest.raises(PSError, match="max_pending_bytes") as info:
        cl.commit(1, 0, 2, 3, keys, g, 0.1, "sgd")
    assert info.value.code == "RESOURCE_EXHAUSTED"
    with pytest.raises(PSError, match="the session failed"):  # it is dead, not waiting
        cl.wait_committed(1, 0, 5.0)
    with pytest.raises(PSError, match="max_pending_bytes"):
        cl.commit(1, 0, 2, 3, keys[:1], g[:1], 0.1, "sgd")  # even a small chunk now
    assert cl.stats()[0]["rows"] == 0  # nothing of the step was applied


def test_decoded_gradients_count_against_the_memory_quota(cluster_factory):
    dim = 256
    cluster = cluster_factory(
        1, dim, test_hooks=True, max_message_bytes=1 << 20, max_memory_bytes=4 << 20
    )
    server = cluster.servers[0]
    cl = cluster.client(compression="int8", max_keys_per_rpc=4096)
    rng = np.random.default_rng(0)
    keys = np.arange(3000, dtype=np.int64)  # int8: 0.8 MB on the wire, 3.1 MB decoded
    g = rng_grads(rng, len(keys), dim)
    server.test_hold("decode_reserved")
    first = cl.commit_async(1, 0, 0, 1, keys, g, 0.1, "sgd")
    try:
        assert server.test_wait_held("decode_reserved", 20)
        with pytest.raises(PSError, match="max_memory_bytes") as info:
            cl.push(keys + 10_000, g, 0.1, "sgd")  # 3.1 MB more would pass the 4 MiB quota
        assert info.value.code == "RESOURCE_EXHAUSTED"
    finally:
        server.test_release("decode_reserved")
    first.wait(30)
    assert cl.stats()[0]["rows"] == len(keys)  # the commit's rows, none of the push's
    cl.push(keys + 10_000, g, 0.1, "sgd")  # once the first is decoded and stored, it fits


def tiered(cluster_factory, tmp_path, **kw):
    cluster = cluster_factory(1, DIM, test_hooks=True, memory_rows=16, ssd_dir=str(tmp_path), **kw)
    return cluster.servers[0], cluster.client()


def test_an_ssd_eviction_failure_fails_the_step_whole(cluster_factory, tmp_path):
    """A step with more rows than the DRAM tier holds: some must go to SSD.  With the SSD
    failing, the step is not applied at all (before: applied, the eviction's failure swallowed
    and the DRAM tier left past its budget)."""
    server, cl = tiered(cluster_factory, tmp_path)  # 16 DRAM rows
    rng = np.random.default_rng(1)
    keys = np.arange(64, dtype=np.int64)
    before = cl.pull(keys)
    server.test_fail_ssd_writes(True)
    with pytest.raises(PSError, match="step 0 was not applied") as info:
        cl.commit(1, 0, 0, 1, keys, rng_grads(rng, len(keys), DIM), 0.1, "sgd")
    assert info.value.code == "INTERNAL"
    stats = cl.stats()[0]
    assert stats["rows"] == 0 and stats["rows_dram"] == 0  # nothing added, nothing over
    np.testing.assert_array_equal(cl.pull(keys), before)
    server.test_fail_ssd_writes(False)
    g = rng_grads(rng, len(keys), DIM)
    cl.commit(2, 0, 0, 1, keys, g, 0.1, "sgd")  # a working SSD: the same step fits
    stats = cl.stats()[0]
    assert stats["rows"] == len(keys) and stats["rows_dram"] <= 16
    want = before.copy()
    _ps.apply_rows(want, g, 0.1, "sgd")
    np.testing.assert_array_equal(cl.pull(keys), want)  # rows written ahead hold the bits


def test_a_failure_after_the_apply_is_reported_as_applied(cluster_factory, tmp_path):
    """Expiry drops rows after the step's rows were applied: its failure fails the session,
    but the step is committed (its rows hold it), not reported as not applied."""
    cluster = cluster_factory(
        1,
        DIM,
        test_hooks=True,
        memory_rows=1000,  # no eviction: the step itself writes nothing to SSD
        ssd_dir=str(tmp_path / "ssd"),
        checkpoint_dir=str(tmp_path / "ck"),
        expire_after=1,
    )
    server, cl = cluster.servers[0], cluster.client()
    rng = np.random.default_rng(2)
    a = np.arange(0, 40, dtype=np.int64)
    b = np.arange(100, 108, dtype=np.int64)
    cl.commit(1, 0, 0, 1, a, rng_grads(rng, len(a), DIM), 0.1, "sgd")  # job step 0
    cl.close_session(1, 0)
    res = cl.save(["ck.bin"], 1)
    cl.load(["ck.bin"], [res[0]["bytes"]], [res[0]["checksum"]])  # a's rows on SSD too
    before = cl.pull(b)
    server.test_fail_ssd_writes(True)
    with pytest.raises(PSError, match="step 0 was applied, then the session failed") as info:
        # Job step 1 writes b and expires a's rows (last updated at step 0): their SSD
        # copies cannot be deleted.
        cl.commit(2, 0, 0, 1, b, rng_grads(rng, len(b), DIM), 0.1, "sgd", base_step=1)
    assert info.value.code == "INTERNAL" and "expired rows" in str(info.value)
    server.test_fail_ssd_writes(False)
    h = cl.pull_async(b, session=2)
    rows = h.wait(20)
    assert h.committed_step() == 0  # before: -1, as if b's rows did not hold the step
    assert (rows != before).any(axis=1).all()  # b's rows hold step 0
    with pytest.raises(PSError, match="was applied, then the session failed"):
        cl.wait_committed(2, 1, 5.0)  # the session is failed: no later step


def test_apply_rows_refuses_what_it_would_update_a_copy_of():
    rows = np.zeros((4, DIM), np.float32)
    sums = np.ones((2, DIM), np.float32)
    with pytest.raises(TypeError, match="C-contiguous"):
        _ps.apply_rows(rows[::2], sums, 0.1, "sgd")
    with pytest.raises(TypeError, match="float32"):
        _ps.apply_rows(np.zeros((2, DIM)), sums, 0.1, "sgd")
    with pytest.raises(TypeError, match="numpy"):
        _ps.apply_rows([[0.0] * DIM] * 2, sums, 0.1, "sgd")
    states = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="states must be C-contiguous"):
        _ps.apply_rows(rows[:2], sums, 0.1, "rowwise_adagrad", 1.0, states[::2])
    np.testing.assert_array_equal(rows, 0)  # nothing changed anywhere
    _ps.apply_rows(rows[:2], sums, 0.1, "sgd")  # a contiguous slice is updated in place
    np.testing.assert_allclose(rows[:2], -0.1)
