"""SparseCommitter against a real in-process shard: the background hand-off and its follow-up
run on the hand-off thread, every reader of the protocol's state drains it first, what the
follow-up raises reaches the training thread at the next call, and the two hand-off strategies
leave the protocol where the docs say."""

import threading

import numpy as np
import pytest
from mpi4py import MPI

from cpu_dist.sparse import Client, Server
from cpu_dist.sparse.aggregation import make_aggregation
from cpu_dist.sparse.commits import CommitSession, SparseCommitter, make_handoff

pytestmark = pytest.mark.timeout(60)
DIM = 4


@pytest.fixture
def shard():
    server = Server(DIM, "t", init_scale=0.1)
    server.start()
    yield Client([server.address], "t", DIM, timeout_s=10)
    server.stop(2)


def committer(client, session_id, aggregation="ps", sync="pipelined", background=False):
    session = CommitSession(client, session_id, 0, 1, lr=0.5, optimizer="sgd", barrier_timeout_s=10)
    return SparseCommitter(
        session,
        make_aggregation(aggregation, MPI.COMM_SELF),
        make_handoff(sync, session, 10),
        background=background,
    )


@pytest.mark.parametrize("aggregation", ["ps", "collective"])
def test_hand_off_and_follow_up_run_in_the_background(shard, aggregation):
    up = committer(shard, 11, aggregation, background=True)
    assert up.background
    keys = np.array([2, 7, 9], dtype=np.int64)
    before = shard.pull(keys)
    ran_on = []
    up.submit(
        0,
        keys,
        np.ones((3, DIM), np.float32),
        then=lambda out: ran_on.append((threading.current_thread().name, out.written)),
    )
    up.wait_readable(1)  # drains the hand-off, then waits for commit 0
    assert ran_on and ran_on[0][0].startswith("sparse-submit")
    if aggregation == "collective":  # the follow-up sees the rows the step writes
        np.testing.assert_array_equal(ran_on[0][1], keys)
    assert up.committed == 0
    np.testing.assert_array_equal(shard.pull(keys), before - np.float32(0.5))
    up.finish(0)


def test_an_error_in_the_follow_up_reaches_the_next_call(shard):
    up = committer(shard, 12, background=True)
    keys = np.array([1], dtype=np.int64)

    def broken(out):
        raise RuntimeError("coherence failed")

    up.submit(0, keys, np.ones((1, DIM), np.float32), then=broken)
    with pytest.raises(RuntimeError, match="coherence failed"):
        up.submit(1, keys, np.ones((1, DIM), np.float32))
    # The protocol's state is unknown after a failed hand-off: every later call fails too.
    with pytest.raises(RuntimeError, match="coherence failed"):
        up.wait_readable(1)


@pytest.mark.parametrize("sync", ["pipelined", "barrier"])
def test_barrier_waits_for_its_commit_and_pipelined_does_not(shard, sync):
    up = committer(shard, 13, sync=sync)
    keys = np.array([4, 5], dtype=np.int64)
    up.submit(0, keys, np.ones((2, DIM), np.float32))
    # barrier: applied before submit returned; pipelined: only acknowledged on demand
    assert (up.committed == 0) == (sync == "barrier")
    assert up.handoff.in_flight == (sync == "pipelined")
    up.wait_readable(1)
    assert up.committed == 0 and not up.handoff.in_flight
    m = up.metrics()
    assert m["rows_pushed"] == 2 and m["commit_wait_s"] >= 0.0
    up.finish(0)


def test_a_read_with_its_commit_collects_the_hand_off_and_counts_the_wait(shard):
    """read_with_commit: the pull that brings commit step-1 (parked on the shard) is the
    read's only wait; afterwards the commit is known applied, so the next hand-off sends
    without asking the shards."""
    up = committer(shard, 15)
    up.start_at(40)  # job step 40 is the session's step 0
    keys = np.array([4, 5], dtype=np.int64)
    before = shard.pull(keys)
    up.submit(40, keys, np.ones((2, DIM), np.float32))
    assert up.handoff.in_flight and up.committed == 39
    rows = up.read_with_commit(
        41,
        lambda: shard.pull_async(
            keys, session=15, after_step=up.session.session_step(40), wait_timeout=10.0
        ).wait(20.0),
    )
    np.testing.assert_array_equal(rows, before - np.float32(0.5))
    assert up.committed == 40 and not up.handoff.in_flight
    assert up.metrics()["commit_wait_s"] > 0.0
    up.finish(40)


def test_a_resumed_session_counts_job_steps_from_its_first(shard):
    up = committer(shard, 14)
    up.start_at(100)
    assert up.committed == 99 and up.session.session_step(105) == 5
    keys = np.array([3], dtype=np.int64)
    up.submit(100, keys, np.ones((1, DIM), np.float32))
    up.wait_readable(101)
    assert up.committed == 100
    assert shard.committed_step(14) == 0  # the shards count the session's own steps
    up.finish(100)


def test_one_workers_key_union_is_its_own_keys_without_a_sort():
    """A single worker's union is the keys it holds: the same array back (no exchange, no
    sort) where they are strictly increasing, as every caller's are; ``np.unique`` else."""
    from cpu_dist.sparse.aggregation import key_union, key_unions

    keys = np.array([-5, 2, 7, 2**40], dtype=np.int64)
    assert key_union(MPI.COMM_SELF, keys) is keys
    assert key_unions(MPI.COMM_SELF, {"a": keys})["a"] is keys
    messy = np.array([7, 2, 7, -5], dtype=np.int64)
    assert key_union(MPI.COMM_SELF, messy).tolist() == [-5, 2, 7]
    out = make_aggregation("ps", MPI.COMM_SELF, exchange_ids=True).reduce_tables(
        {"a": (keys, np.ones((4, 2), np.float32)), "b": (messy[:0], np.ones((0, 2), np.float32))}
    )
    assert out["a"].written is keys and out["b"].written.tolist() == []


@pytest.mark.parametrize("runs", [2, 5])
def test_union_of_workers_sorted_runs_is_np_unique(runs):
    """Workers' sorted unique keys, concatenated in rank order (what the exchange gathers),
    overlapping and not, and keys in no order at all: the union is ``np.unique``'s."""
    from cpu_dist.sparse.aggregation import sorted_union

    rng = np.random.default_rng(runs)
    gathered = np.concatenate(
        [np.unique(rng.integers(-(2**62), 2**62, 50)) for _ in range(runs)]
        + [np.unique(rng.integers(0, 40, 30)) for _ in range(runs)]
    )
    for keys in (gathered, rng.permutation(gathered), np.zeros(0, np.int64)):
        got = sorted_union(keys)
        assert got.dtype == np.int64 and np.array_equal(got, np.unique(keys))
