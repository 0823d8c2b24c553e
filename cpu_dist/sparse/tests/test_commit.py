"""The ordered commit protocol: a step applies only when every rank delivered, retries are
idempotent, conflicts and out-of-order steps are refused, and the bits do not depend on
arrival order or chunking."""

import threading

import numpy as np
import pytest

from cpu_dist.sparse import PSError
from cpu_dist.sparse.grpc_stubs import token_channel

from .conftest import TOKEN, rng_grads
from .reference import RefTable

pytestmark = pytest.mark.timeout(60)
DIM = 4


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def adagrad_chunk(pb, session, rank, world_size, index, count, keys, grads):
    """Chunk ``index`` of ``count`` of step 0 of ``session``, row-wise Adagrad at lr 0.3."""
    return pb[0].CommitRequest(
        table=b"embedding",
        session=session,
        step=0,
        rank=rank,
        world_size=world_size,
        chunk_index=index,
        chunk_count=count,
        dim=DIM,
        lr=0.3,
        optimizer=pb[0].ROWWISE_ADAGRAD,
        keys=keys.tobytes(),
        grads=grads.tobytes(),
    )


def test_two_ranks_and_empty_marker(cluster_factory):
    c = cluster_factory(num_shards=2, dim=DIM)
    cl = c.client()
    ref = RefTable(DIM, c.seed, c.init_scale)
    rng = np.random.default_rng(1)
    k0, g0 = rng.integers(0, 30, 12).astype(np.int64), rng_grads(rng, 12, DIM)
    k1, g1 = rng.integers(0, 30, 9).astype(np.int64), rng_grads(rng, 9, DIM)
    assert cl.committed_step(5) == -1
    cl.commit(5, 0, 0, 2, k0, g0, 0.1, "rowwise_adagrad")
    assert cl.committed_step(5) == -1 and c.rows() == 0  # rank 1 missing: nothing applied
    cl.commit(5, 0, 1, 2, k1, g1, 0.1, "rowwise_adagrad")
    assert cl.wait_committed(5, 0, 10.0) == 0
    ref.commit([(k0, g0), (k1, g1)], 0.1, "rowwise_adagrad")
    # Step 1: rank 0 has no rows (empty marker).
    empty_k, empty_g = np.zeros(0, np.int64), np.zeros((0, DIM), np.float32)
    cl.commit(5, 1, 0, 2, empty_k, empty_g, 0.1, "rowwise_adagrad")
    cl.commit(5, 1, 1, 2, k1, g1, 0.1, "rowwise_adagrad")
    assert cl.wait_committed(5, 1, 10.0) == 1
    ref.commit([(empty_k, empty_g), (k1, g1)], 0.1, "rowwise_adagrad")
    # Step 2: all empty still commits.
    cl.commit(5, 2, 0, 2, empty_k, empty_g, 0.1)
    cl.commit(5, 2, 1, 2, empty_k, empty_g, 0.1)
    assert cl.wait_committed(5, 2, 10.0) == 2
    k, v, s = cl.dump()
    rk, rv, rs = ref.dump()
    assert np.array_equal(k, rk) and np.array_equal(bits(v), bits(rv))
    assert np.array_equal(bits(s), bits(rs))


def test_retry_of_committed_chunk_is_not_reapplied(cluster_factory):
    c = cluster_factory(num_shards=1, dim=DIM)
    cl = c.client()
    keys, grads = np.arange(4, dtype=np.int64), np.ones((4, DIM), np.float32)
    cl.commit(1, 0, 0, 1, keys, grads, 0.5)
    assert cl.wait_committed(1, 0, 5.0) == 0
    after = cl.dump()
    cl.commit(1, 0, 0, 1, keys, grads, 0.5)  # retry: acknowledged, nothing re-applied
    cl.commit(1, 0, 0, 1, keys, grads * 3, 0.5)  # even with other bytes: step is done
    assert all(np.array_equal(x, y) for x, y in zip(after, cl.dump()))
    assert cl.committed_step(1) == 0
    stats = cl.stats()[0]  # one apply counted and timed, the retries not
    assert stats["applied_steps"] == 1 and stats["apply_ns"] > 0, stats


def test_pending_retry_identical_ok_conflicting_aborted(cluster_factory):
    c = cluster_factory(num_shards=1, dim=DIM)
    cl = c.client()
    keys, grads = np.arange(4, dtype=np.int64), np.ones((4, DIM), np.float32)
    cl.commit(2, 0, 0, 2, keys, grads, 0.5)
    cl.commit(2, 0, 0, 2, keys, grads, 0.5)  # identical retry while pending: fine
    with pytest.raises(
        PSError, match="ABORTED: conflicting retry of session 2 step 0 rank 0 chunk 0"
    ):
        cl.commit(2, 0, 0, 2, keys, grads * 2, 0.5)
    with pytest.raises(PSError, match="FAILED_PRECONDITION: out-of-order step 1"):
        cl.commit(2, 1, 1, 2, keys, grads, 0.5)
    with pytest.raises(PSError, match="INVALID_ARGUMENT: world_size 3 does not match"):
        cl.commit(2, 0, 1, 3, keys, grads, 0.5)
    with pytest.raises(PSError, match=r"INVALID_ARGUMENT: lr 0\.25 / optimizer sgd differ"):
        cl.commit(2, 0, 1, 2, keys, grads, 0.25)
    assert c.rows() == 0 and cl.committed_step(2) == -1
    cl.commit(2, 0, 1, 2, keys, grads, 0.5)
    assert cl.wait_committed(2, 0, 5.0) == 0
    ref = RefTable(DIM, c.seed, c.init_scale)
    ref.commit([(keys, grads), (keys, grads)], 0.5)
    assert np.array_equal(bits(cl.dump()[1]), bits(ref.dump()[1]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_arrival_order_and_chunking_do_not_change_bits(cluster_factory, pb, seed):
    rng = np.random.default_rng(seed)
    per_rank = [
        (rng.integers(0, 25, 20).astype(np.int64), rng_grads(rng, 20, DIM)) for _ in range(3)
    ]
    dumps = []
    for chunking in [1, 3, 7]:
        c = cluster_factory(num_shards=1, dim=DIM)
        channel = token_channel(c.addresses[0], TOKEN)
        stub = pb[1].ParameterServerStub(channel)
        chunks = []
        for r, (k, g) in enumerate(per_rank):
            parts = np.array_split(np.arange(20), chunking)
            for i, p in enumerate(parts):
                chunks.append(adagrad_chunk(pb, 9, r, 3, i, chunking, k[p], g[p]))
        for j in rng.permutation(len(chunks)):
            stub.Commit(chunks[j], timeout=10)
        cl = c.client()
        assert cl.wait_committed(9, 0, 5.0) == 0
        dumps.append(cl.dump())
        channel.close()
    ref = RefTable(DIM, 7, 0.1)
    ref.commit(per_rank, 0.3, "rowwise_adagrad")
    rk, rv, rs = ref.dump()
    for k, v, s in dumps:
        assert np.array_equal(k, rk)
        assert np.array_equal(bits(v), bits(rv)) and np.array_equal(bits(s), bits(rs))


@pytest.mark.parametrize("keys", ["rising", "repeated", "falling"])
def test_one_rank_over_chunks_applies_as_the_model(cluster_factory, pb, keys):
    """A world of one rank: rising keys are laid end to end (no summing), repeated or falling
    ones go through the accumulator; both give the model's bits, chunks or not."""
    rng = np.random.default_rng(3)
    k = {
        "rising": np.sort(rng.choice(1000, 40, replace=False)),
        "repeated": np.sort(rng.integers(0, 12, 40)),  # rises, but not strictly
        "falling": np.sort(rng.choice(1000, 40, replace=False))[::-1],
    }[keys].astype(np.int64)
    g = rng_grads(rng, 40, DIM)
    ref = RefTable(DIM, 7, 0.1)
    ref.commit([(k, g)], 0.3, "rowwise_adagrad")
    rk, rv, rs = ref.dump()
    for chunking in [1, 3]:
        c = cluster_factory(num_shards=1, dim=DIM)
        channel = token_channel(c.addresses[0], TOKEN)
        stub = pb[1].ParameterServerStub(channel)
        for i, p in enumerate(np.array_split(np.arange(40), chunking)):
            stub.Commit(adagrad_chunk(pb, 4, 0, 1, i, chunking, k[p], g[p]), timeout=10)
        cl = c.client()
        assert cl.wait_committed(4, 0, 5.0) == 0
        dk, dv, ds = cl.dump()
        channel.close()
        assert np.array_equal(dk, rk)
        assert np.array_equal(bits(dv), bits(rv)) and np.array_equal(bits(ds), bits(rs))


@pytest.mark.parametrize("kinds", [("rising",) * 3, ("rising", "falling", "rising")])
def test_ranks_rows_merged_or_accumulated_as_the_model(cluster_factory, pb, kinds):
    """Three ranks whose keys overlap: when every rank's keys rise, the shard merges the
    ranks' rows (summed per key in rank order); when one rank's do not, it sums them through
    the accumulator.  Either way the model's bits, however the chunks are cut and arrive."""
    rng = np.random.default_rng(5)
    per_rank = []
    for kind in kinds:
        k = np.sort(rng.choice(60, 30, replace=False)).astype(np.int64)
        per_rank.append((k if kind == "rising" else k[::-1].copy(), rng_grads(rng, 30, DIM)))
    ref = RefTable(DIM, 7, 0.1)
    ref.commit(per_rank, 0.3, "rowwise_adagrad")
    rk, rv, rs = ref.dump()
    for chunking in [1, 4]:
        c = cluster_factory(num_shards=1, dim=DIM)
        channel = token_channel(c.addresses[0], TOKEN)
        stub = pb[1].ParameterServerStub(channel)
        chunks = [
            adagrad_chunk(pb, 6, r, len(kinds), i, chunking, k[p], g[p])
            for r, (k, g) in enumerate(per_rank)
            for i, p in enumerate(np.array_split(np.arange(30), chunking))
        ]
        for j in rng.permutation(len(chunks)):
            stub.Commit(chunks[j], timeout=10)
        cl = c.client()
        assert cl.wait_committed(6, 0, 5.0) == 0
        dk, dv, ds = cl.dump()
        channel.close()
        assert np.array_equal(dk, rk)
        assert np.array_equal(bits(dv), bits(rv)) and np.array_equal(bits(ds), bits(rs))


def test_several_shards_small_chunks_concurrent_ranks(cluster_factory):
    c = cluster_factory(num_shards=3, dim=DIM)
    world = 3
    clients = [c.client(max_keys_per_rpc=3) for _ in range(world)]
    ref = RefTable(DIM, c.seed, c.init_scale)
    rng = np.random.default_rng(5)
    errors = []
    for step in range(4):
        data = [
            (rng.integers(0, 50, int(rng.integers(0, 15))).astype(np.int64), None)
            for _ in range(world)
        ]
        data = [(k, rng_grads(rng, k.size, DIM)) for k, _ in data]

        def rank_main(r):
            try:
                h = clients[r].commit_async(3, step, r, world, data[r][0], data[r][1], 0.1, "sgd")
                h.wait(10.0)
                assert clients[r].wait_committed(3, step, 10.0) == step
            except Exception as e:  # surfaced below
                errors.append(e)

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        ref.commit(data, 0.1, "sgd")
    k, v, _ = clients[0].dump()
    rk, rv, _ = ref.dump()
    assert np.array_equal(k, rk) and np.array_equal(bits(v), bits(rv))
    for r in range(world):
        clients[r].close_session(3, r)
    assert clients[0].committed_step(3) == 3  # remembered after the session was dropped


def test_wait_committed_long_poll_wakes_on_commit(cluster_factory):
    c = cluster_factory(num_shards=2, dim=DIM)
    waiter, sender = c.client(), c.client()
    result = []
    t = threading.Thread(target=lambda: result.append(waiter.wait_committed(4, 0, 20.0)))
    t.start()
    keys = np.arange(6, dtype=np.int64)
    sender.commit(4, 0, 0, 1, keys, np.ones((6, DIM), np.float32), 0.1)
    t.join(20)
    assert result == [0]
    with pytest.raises(TimeoutError):
        waiter.wait_committed(4, 1, 0.3)


def test_close_session_drops_it(cluster_factory):
    c = cluster_factory(num_shards=1, dim=DIM)
    cl = c.client()
    k, g = np.arange(3, dtype=np.int64), np.ones((3, DIM), np.float32)
    cl.commit(8, 0, 0, 2, k, g, 0.1)
    cl.commit(8, 0, 1, 2, k, g, 0.1)
    cl.close_session(8, 0)  # nothing pending: dropped
    # A late chunk never re-creates it: a retry of the committed step is acknowledged...
    cl.commit(8, 0, 1, 2, k, g, 0.1)
    assert cl.wait_committed(8, 0, 5.0) == 0
    # ...anything newer is refused, and nothing is applied.
    before = cl.dump()
    with pytest.raises(PSError, match="FAILED_PRECONDITION: session 8 is closed"):
        cl.commit(8, 1, 0, 2, k, g, 0.1)
    assert all(np.array_equal(x, y) for x, y in zip(before, cl.dump()))
    assert cl.committed_step(8) == 0
    cl.close_session(8, 0)
    cl.close_session(8, 1)  # twice is harmless
