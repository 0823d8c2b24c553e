"""Catching rows up on the worker (cpu_dist/sparse/catch_up.py) against a real shard: what a
pull's row_steps say, and that applying the commits a row misses gives the shard's bits."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cpu_dist.sparse import _ps
from cpu_dist.sparse.catch_up import RecentCommits

from .conftest import rng_grads

pytestmark = pytest.mark.timeout(120)

DIM = 8
UNKNOWN = np.iinfo(np.int64).min


def commit_step(client, session, step, grads_by_rank, keys, opt, lr=0.05, base=0):
    """Every rank's chunk of one step (this test plays all ranks)."""
    world = len(grads_by_rank)
    for rank, g in enumerate(grads_by_rank):
        client.commit(session, step, rank, world, keys, g, lr, opt, max_ahead=4, base_step=base)


def pulled(client, keys, session, states=False):
    h = client.pull_async(keys, session=session, row_steps=True, row_states=states)
    rows = h.wait(20)
    return rows, h.row_steps(), h.row_states()


@pytest.mark.parametrize("opt", ["sgd", "rowwise_adagrad"])
def test_apply_rows_gives_the_shards_bits(cluster_factory, opt):
    cl = cluster_factory(2, DIM).client()
    rng = np.random.default_rng(0)
    keys = np.arange(0, 400, 3, dtype=np.int64)
    commit_step(cl, 1, 0, [rng_grads(rng, len(keys), DIM)] * 2, keys, opt)  # some state first
    before, steps, states = pulled(cl, keys, 1, states=opt != "sgd")
    assert (steps == 0).all()  # commit 0 is held, nothing after it
    g = [rng_grads(rng, len(keys), DIM) * 1e-3 for _ in range(2)]
    commit_step(cl, 1, 1, g, keys, opt)
    _ps.apply_rows(before, g[0] + g[1], 0.05, opt, 2, states)  # the shard adds in rank order
    after, steps, _ = pulled(cl, keys, 1)
    np.testing.assert_array_equal(before, after)
    assert (steps == 1).all()


def test_row_steps_before_any_commit_and_for_rows_of_another_session(cluster_factory):
    cl = cluster_factory(1, DIM).client()
    keys = np.array([1, 2, 3], dtype=np.int64)
    _, steps, states = pulled(cl, keys, 5)
    np.testing.assert_array_equal(steps, [-1, -1, -1])  # nothing committed: -1 + 0
    assert states is None
    commit_step(cl, 5, 0, [np.ones((3, DIM), np.float32)], keys, "sgd")
    # Sessions 6 and 7 write keys 2 and 3 at job steps 10 and 300: no step of session 5
    # (committed 0, base 0), which applied nothing after its step 0.
    commit_step(cl, 6, 0, [np.ones((1, DIM), np.float32)], keys[1:2], "sgd", base=10)
    commit_step(cl, 7, 0, [np.ones((1, DIM), np.float32)], keys[2:], "sgd", base=300)
    _, steps, _ = pulled(cl, keys, 5)
    np.testing.assert_array_equal(steps, [0, 0, 0])
    with pytest.raises(ValueError, match="need a session"):
        cl.pull_async(keys, row_steps=True)


def test_an_ended_session_reports_no_commit_beyond_its_last(cluster_factory):
    cl = cluster_factory(1, DIM).client()
    keys = np.array([1, 2], dtype=np.int64)
    commit_step(cl, 5, 0, [np.ones((2, DIM), np.float32)], keys, "sgd")
    cl.close_session(5, 0)
    commit_step(cl, 6, 0, [np.ones((1, DIM), np.float32)], keys[1:], "sgd", base=10)
    _, steps, _ = pulled(cl, keys, 5)  # key 2's step-10 write is no commit of session 5
    np.testing.assert_array_equal(steps, [0, 0])


HOLD = "pull_between_stripes"


def pull_racing(server, cl, keys, session, commit):
    """A pull whose gather holds after its first stripe while `commit()` is applied: the
    interleaving of the catch-up race, every time (a test hook of the shard)."""
    server.test_hold(HOLD)
    h = cl.pull_async(keys, session=session, row_steps=True)
    try:
        assert server.test_wait_held(HOLD, 20)
        commit()
    finally:
        server.test_release(HOLD)
    rows = h.wait(20)
    return rows, h.row_steps(), h.committed_step()


@pytest.mark.parametrize("base", [0, 100])  # a session's first step, and the first after --resume
def test_a_first_commit_applied_during_the_gather_is_reported_exactly(cluster_factory, base):
    cluster = cluster_factory(1, DIM, test_hooks=True)
    cl = cluster.client()
    keys = np.arange(400, dtype=np.int64)  # over every stripe
    before = cl.pull(keys)
    g = rng_grads(np.random.default_rng(3), len(keys), DIM)
    rows, held, committed = pull_racing(
        cluster.servers[0], cl, keys, 1, lambda: commit_step(cl, 1, 0, [g], keys, "sgd", base=base)
    )
    assert committed == -1  # read before the gather: step 0 had not committed
    after = cl.pull(keys)
    changed = (rows != before).any(axis=1)
    assert changed.any() and (~changed).any()  # the commit landed between two stripes
    np.testing.assert_array_equal(held[changed], 0)  # those rows hold step 0 already
    np.testing.assert_array_equal(held[~changed], -1)
    recent = RecentCommits(2, 0.05, "sgd", 1)
    recent.add(0, keys, g)
    recent.apply(keys, rows, held, 0)
    np.testing.assert_array_equal(rows, after)  # step 0 applied once to every row


def test_rows_another_session_left_are_no_steps_of_this_one(cluster_factory):
    """--reuse-shard-rows: a new session (base 0) trains on rows an ended one wrote at job
    steps 0..3; their steps are not the new session's."""
    cluster = cluster_factory(1, DIM, test_hooks=True)
    cl = cluster.client()
    rng = np.random.default_rng(4)
    keys = np.arange(400, dtype=np.int64)
    for step in range(4):
        commit_step(cl, 5, step, [rng_grads(rng, len(keys), DIM)], keys, "sgd")
    cl.close_session(5, 0)
    mine = keys[::2]
    commit_step(cl, 6, 0, [rng_grads(rng, len(mine), DIM)], mine, "sgd")
    _, held, _ = pulled(cl, keys, 6)
    np.testing.assert_array_equal(held, 0)  # session 6 applied its step 0 and nothing after
    before = cl.pull(keys)
    g = rng_grads(rng, len(mine), DIM)
    rows, held, committed = pull_racing(
        cluster.servers[0], cl, keys, 6, lambda: commit_step(cl, 6, 1, [g], mine, "sgd")
    )
    assert committed == 0
    changed = (rows != before).any(axis=1)
    assert changed.any() and (~changed).any()
    # A row at job step 1 may be session 5's step 1 or session 6's: no bound, never a guess.
    assert (held[changed] == UNKNOWN).all()
    np.testing.assert_array_equal(held[~changed], 0)
    recent = RecentCommits(2, 0.05, "sgd", 1)
    recent.add(1, mine, g)
    assert not recent.covers(held[changed], 1).any()  # the worker pulls those again


def test_the_per_row_fields_count_as_pulled_bytes(cluster_factory):
    cl = cluster_factory(2, DIM).client()
    keys = np.arange(50, dtype=np.int64)
    before = cl.traffic()["bytes_pulled"]
    pulled(cl, keys, 1)
    plain = cl.traffic()["bytes_pulled"] - before
    assert plain == 50 * (8 + 4 * DIM + 1)  # key, float32 row, one row_steps byte
    before = cl.traffic()["bytes_pulled"]
    pulled(cl, keys, 1, states=True)
    assert cl.traffic()["bytes_pulled"] - before == plain + 50 * 4


@pytest.mark.parametrize("opt", ["sgd", "rowwise_adagrad"])
def test_pulls_during_commits_catch_up_to_the_final_rows(cluster_factory, opt):
    """Pulls racing a stream of commits: whatever each pull caught (a commit applied during
    it is in a row or not, per its row_steps), applying the rest gives the final bits."""
    cl = cluster_factory(2, DIM).client()
    rng = np.random.default_rng(1)
    steps, lr, world = 30, 0.05, 2
    plan = []
    for _ in range(steps):
        keys = np.unique(rng.integers(0, 300, 120)).astype(np.int64)
        plan.append((keys, [rng_grads(rng, len(keys), DIM) for _ in range(world)]))
    recent = RecentCommits(steps, lr, opt, world)
    for s, (keys, g) in enumerate(plan):
        recent.add(s, keys, g[0] + g[1])
    probe = np.arange(300, dtype=np.int64)
    seen = []
    done = threading.Event()

    def puller():
        while not done.is_set():
            seen.append(pulled(cl, probe, 3, states=opt != "sgd"))

    t = threading.Thread(target=puller)
    t.start()
    try:
        for s, (keys, g) in enumerate(plan):
            commit_step(cl, 3, s, g, keys, opt, lr)
    finally:
        done.set()
        t.join(30)
    final, final_steps, _ = pulled(cl, probe, 3)
    assert (final_steps == steps - 1).all()
    caught = 0
    for rows, held, states in seen:
        assert recent.covers(held, steps - 1).all()
        caught += recent.apply(probe, rows, held, steps - 1, states)
        np.testing.assert_array_equal(rows, final)
    assert len(seen) > 2 and caught > 0


def test_compressed_commits_are_caught_up_as_the_shard_decodes_them():
    recent = RecentCommits(2, 0.1, "sgd", 2, compression="int8")
    g = np.linspace(-1, 1, 2 * DIM, dtype=np.float32).reshape(2, DIM) / 3
    recent.add(0, np.array([4, 9], np.int64), g)
    rows = np.zeros((2, DIM), np.float32)
    recent.apply(np.array([4, 9], np.int64), rows, np.array([-1, 0], np.int64), 0)
    shard_sees = _ps.decode_rows(_ps.encode_rows(g, "int8"), DIM, "int8")
    want = np.zeros((1, DIM), np.float32)
    _ps.apply_rows(want, shard_sees[:1], 0.1, "sgd", 2)
    np.testing.assert_array_equal(rows[0], want[0])
    np.testing.assert_array_equal(rows[1], 0)  # it held step 0 already
    assert not recent.covers(np.array([-3]), 1).any()  # step 1 is not held
