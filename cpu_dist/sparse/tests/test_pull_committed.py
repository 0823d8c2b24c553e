"""PullCommitted: a pull parked on each shard until a commit step is applied there, then
answered as a pull (the read that depends on a commit in one round trip, started before the
commit).  Real in-process shards; the rows are compared with the numpy reference bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_dist.common import contracts
from cpu_dist.sparse import Client, PSError, Server

from .conftest import TOKEN, rng_grads, wait_until
from .reference import RefTable

pytestmark = pytest.mark.timeout(60)
DIM = 4
SESSION = 9


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def parked(cluster) -> int:
    return sum(s.stats()["waiters"] for s in cluster.servers)


def pulls(cluster) -> list[int]:
    return [s.stats()["pull_calls"] for s in cluster.servers]


def test_a_parked_pull_answers_once_its_step_commits_with_the_rows_after_it(cluster_factory):
    c = cluster_factory(num_shards=2, dim=DIM)
    ranks = [c.client() for _ in range(2)]
    rng = np.random.default_rng(4)
    keys = np.arange(40, dtype=np.int64)
    grads = [rng_grads(rng, keys.size, DIM) for _ in range(2)]
    ranks[0].commit(SESSION, 0, 0, 2, keys, grads[0], 0.1)
    # Keys of shard 0 only, repeated: shard 1 is asked too (an empty part), so that the
    # reply's committed step speaks for every shard.
    mine = keys[contracts.shard_of(keys, 2) == 0]
    ask = np.concatenate([mine, mine[:3]])
    before = pulls(c)
    h = ranks[0].pull_async(ask, session=SESSION, after_step=0, wait_timeout=20.0)
    wait_until(lambda: parked(c) == 2, what="the pull parked on both shards")
    assert not h.done() and pulls(c) == before  # nothing gathered before the commit
    ranks[1].commit(SESSION, 0, 1, 2, keys, grads[1], 0.1)  # step 0 complete
    rows = h.wait(20.0)
    assert h.committed_step() == 0
    assert [a - b for a, b in zip(pulls(c), before)] == [1, 1]
    ref = RefTable(DIM, c.seed, c.init_scale)
    ref.commit([(keys, grads[0]), (keys, grads[1])], 0.1, "sgd")
    assert np.array_equal(bits(rows), bits(np.stack([ref.get(int(k)) for k in ask])))
    # A step already committed: answered at once, as a plain pull.
    again = ranks[1].pull_async(keys, session=SESSION, after_step=0, wait_timeout=20.0)
    assert np.array_equal(bits(again.wait(20.0)), bits(np.stack([ref.get(int(k)) for k in keys])))


def test_an_empty_parked_pull_is_the_wait_alone(cluster_factory):
    c = cluster_factory(num_shards=3, dim=DIM)
    cl = c.client()
    cl.commit(SESSION, 0, 0, 1, np.arange(5, dtype=np.int64), np.ones((5, DIM), np.float32), 0.1)
    h = cl.pull_async(np.zeros(0, np.int64), session=SESSION, after_step=0, wait_timeout=20.0)
    assert h.wait(20.0).shape == (0, DIM)
    assert h.committed_step() == 0


def test_a_step_that_never_commits_ends_the_pull_by_its_deadline_naming_it(cluster_factory):
    c = cluster_factory(num_shards=2, dim=DIM)
    cl = c.client()
    cl.commit(SESSION, 0, 0, 2, np.arange(3, dtype=np.int64), np.ones((3, DIM), np.float32), 0.1)
    h = cl.pull_async(np.arange(3, dtype=np.int64), session=SESSION, after_step=0, wait_timeout=0.5)
    with pytest.raises(PSError, match=r"DEADLINE_EXCEEDED.*step 0 of session 9 not committed"):
        h.wait(20.0)
    assert parked(c) == 0


def test_a_session_that_ends_fails_its_parked_pulls(cluster_factory):
    c = cluster_factory(num_shards=1, dim=DIM)
    cl = c.client()
    cl.commit(SESSION, 0, 0, 2, np.arange(3, dtype=np.int64), np.ones((3, DIM), np.float32), 0.1)
    h = cl.pull_async(
        np.arange(3, dtype=np.int64), session=SESSION, after_step=0, wait_timeout=20.0
    )
    wait_until(lambda: parked(c) == 1, what="the pull parked")
    assert cl.abort_sessions() == [{"aborted": 1}]
    with pytest.raises(PSError, match="ABORTED: session 9 is closed"):
        h.wait(20.0)


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"after_step": 0, "wait_timeout": 1.0}, "after_step needs a session"),
        ({"session": 1, "after_step": -1, "wait_timeout": 1.0}, "after_step must be >= 0"),
        ({"session": 1, "after_step": 0}, "after_step needs a wait_timeout > 0"),
        ({"session": 1, "after_step": 0, "wait_timeout": 0.0}, "wait_timeout > 0"),
    ],
)
def test_a_parked_pull_without_what_it_needs_is_refused_before_it_is_sent(cluster_factory, kw, why):
    c = cluster_factory(num_shards=1, dim=DIM)
    cl = c.client()
    with pytest.raises(ValueError, match=why):
        cl.pull_async(np.arange(3, dtype=np.int64), **kw)
    with pytest.raises(ValueError, match=why):
        cl.pull_tables_async({"embedding": np.arange(3, dtype=np.int64)}, **kw)
    assert pulls(c) == [0]


def test_the_shard_refuses_a_parked_pull_it_cannot_serve_at_once(cluster_factory, pb):
    """Checked when it arrives (not when its step commits): a table it does not hold."""
    import grpc

    pb2, pb2_grpc = pb
    c = cluster_factory(num_shards=1, dim=DIM)
    md = [("x-cpu-dist-token", TOKEN)]
    keys = np.arange(2, dtype=np.int64).tobytes()
    with grpc.insecure_channel(c.addresses[0]) as channel:
        stub = pb2_grpc.ParameterServerStub(channel)
        req = pb2.PullRequest(table=b"nope", dim=DIM, keys=keys, session=3, after_step=5)
        with pytest.raises(grpc.RpcError) as err:
            stub.PullCommitted(req, metadata=md, timeout=20.0)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in err.value.details()
        req = pb2.PullRequest(table=b"embedding", dim=DIM, keys=keys, session=3)
        with pytest.raises(grpc.RpcError) as err:
            stub.PullCommitted(req, metadata=md, timeout=20.0)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "after_step" in err.value.details()
    assert parked(c) == 0


def test_a_parked_pull_of_tables_reaches_every_shard():
    specs = [
        {"name": "a", "dim": 4, "optimizer": "sgd", "init_scale": 0.5, "seed": 3},
        {"name": "b", "dim": 8, "optimizer": "sgd", "init_scale": 0.25, "seed": 3},
    ]
    servers = [Server(0, TOKEN, tables=specs, shard_index=i, num_shards=2) for i in range(2)]
    for s in servers:
        s.start()
    try:
        addresses = [s.address for s in servers]
        ranks = [
            Client(addresses, TOKEN, tables=[("a", 4), ("b", 8)], timeout_s=20.0) for _ in range(2)
        ]
        ka = np.arange(10, dtype=np.int64)
        ga = [np.full((10, 4), r + 1, np.float32) for r in range(2)]
        none_b = (np.zeros(0, np.int64), np.zeros((0, 8), np.float32), 0.1)
        ranks[0].commit_tables(SESSION, 0, 0, 2, {"a": (ka, ga[0], 0.1), "b": none_b})
        # Table a's keys of shard 1 only; table b none: shard 0 gets an empty part.
        mine = ka[contracts.shard_of(ka, 2, table="a") == 1]
        h = ranks[0].pull_tables_async(
            {"a": mine, "b": np.zeros(0, np.int64)},
            session=SESSION,
            after_step=0,
            wait_timeout=20.0,
        )
        wait_until(lambda: sum(s.stats()["waiters"] for s in servers) == 2, what="parked on both")
        ranks[1].commit_tables(SESSION, 0, 1, 2, {"a": (ka, ga[1], 0.1), "b": none_b})
        got = h.wait(20.0)
        assert h.committed_step() == 0
        first = contracts.row_init(3, mine, 4, 0.5, table="a")
        after = ranks[1].pull_tables({"a": mine})["a"]  # step 0 applied, nothing after it
        assert not np.array_equal(after, first)
        assert np.array_equal(bits(got["a"]), bits(after))
        assert got["b"].shape == (0, 8)
    finally:
        for s in servers:
            s.stop(2.0)
