"""The commit window: a shard accepts chunks for steps up to max_ahead beyond its committed
one, holds the early steps (within a per-session byte cap), and still applies steps strictly
in order, each summed in rank and chunk order: the bits are those of in-order delivery."""

import threading

import numpy as np
import pytest

from cpu_dist.sparse import PSError

from .conftest import rng_grads
from .reference import RefTable

pytestmark = pytest.mark.timeout(60)
DIM = 4
WORLD = 3


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def make_steps(seed: int, steps: int):
    """steps x WORLD (keys, grads): overlapping keys, so that order would show in the bits."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        ranks = []
        for _ in range(WORLD):
            k = rng.choice(40, int(rng.integers(1, 20)), replace=False).astype(np.int64)
            ranks.append((k, rng_grads(rng, k.size, DIM)))
        out.append(ranks)
    return out


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_early_steps_are_held_and_applied_after_their_turn_with_the_same_bits(
    cluster_factory, optimizer
):
    data = make_steps(3, 3)
    c = cluster_factory(num_shards=2, dim=DIM)
    cl = c.client(max_keys_per_rpc=4)  # several chunks per rank and shard
    ahead = dict(max_ahead=3)
    # Everything of steps 1 and 2 arrives before step 0's last rank.
    for r in range(WORLD - 1):
        cl.commit(5, 0, r, WORLD, *data[0][r], 0.1, optimizer, **ahead)
    for step in (2, 1):
        for r in range(WORLD):
            cl.commit(5, step, r, WORLD, *data[step][r], 0.1, optimizer, **ahead)
    assert cl.committed_step(5) == -1  # held, not applied
    assert c.rows() == 0
    cl.commit(5, 0, 2, WORLD, *data[0][2], 0.1, optimizer, **ahead)  # step 0 complete
    assert cl.wait_committed(5, 2, 10.0) == 2  # ...and the held steps 1, 2 after it
    ref = RefTable(DIM, c.seed, c.init_scale)
    for step in range(3):
        ref.commit(data[step], 0.1, optimizer)
    k, v, s = cl.dump()
    rk, rv, rs = ref.dump()
    assert np.array_equal(k, rk)
    assert np.array_equal(bits(v), bits(rv)) and np.array_equal(bits(s), bits(rs))


def test_a_chunk_beyond_the_window_is_refused_naming_it(cluster_factory):
    cl = cluster_factory(num_shards=1, dim=DIM).client()
    k, g = np.arange(3, dtype=np.int64), np.ones((3, DIM), np.float32)
    with pytest.raises(PSError, match=r"FAILED_PRECONDITION: out-of-order step 1 .*max_ahead 1"):
        cl.commit(6, 1, 0, 2, k, g, 0.1)  # today's rule: only committed + 1
    msg = r"out-of-order step 3 for session 6: committed step is -1, .*accepts steps 0..2"
    with pytest.raises(PSError, match=msg):
        cl.commit(6, 3, 0, 2, k, g, 0.1, max_ahead=3)
    cl.commit(6, 2, 0, 2, k, g, 0.1, max_ahead=3)  # inside the window: held
    for bad in (0, 65):
        with pytest.raises(ValueError, match=r"max_ahead must be in 1\.\.64"):
            cl.commit(6, 0, 0, 2, k, g, 0.1, max_ahead=bad)


def test_held_steps_count_against_the_session_byte_cap(cluster_factory):
    chunk = 10 * (8 + 4 * DIM)  # bytes of a 10-row chunk
    c = cluster_factory(num_shards=1, dim=DIM, max_held_bytes=2 * chunk)
    cl = c.client()
    k, g = np.arange(10, dtype=np.int64), np.ones((10, DIM), np.float32)
    cl.commit(7, 1, 0, 2, k, g, 0.1, max_ahead=4)
    cl.commit(7, 2, 0, 2, k, g, 0.1, max_ahead=4)
    with pytest.raises(
        PSError,
        match=r"RESOURCE_EXHAUSTED: session 7 step 3 rank 0: .*"
        r"would exceed max_held_bytes 480",
    ):
        cl.commit(7, 3, 0, 2, k, g, 0.1, max_ahead=4)
    for r in (0, 1):  # the pending step is never refused by the cap
        cl.commit(7, 0, r, 2, k, g, 0.1, max_ahead=4)
    cl.commit(7, 1, 1, 2, k, g, 0.1, max_ahead=4)
    cl.commit(7, 2, 1, 2, k, g, 0.1, max_ahead=4)
    assert cl.committed_step(7) == 2
    cl.commit(7, 3, 0, 2, k, g, 0.1, max_ahead=4)  # room again: the held steps applied


def test_concurrent_ranks_racing_ahead_match_in_order_delivery(cluster_factory):
    steps = 6
    data = make_steps(9, steps)
    c = cluster_factory(num_shards=2, dim=DIM)
    clients = [c.client(max_keys_per_rpc=5) for _ in range(WORLD)]
    errors = []

    def rank_main(r):  # each rank sends every step without waiting for any commit
        try:
            for step in range(steps):
                k, g = data[step][r]
                clients[r].commit(8, step, r, WORLD, k, g, 0.05, "sgd", max_ahead=steps)
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert clients[0].wait_committed(8, steps - 1, 10.0) == steps - 1
    ref = RefTable(DIM, c.seed, c.init_scale)
    for step in range(steps):
        ref.commit(data[step], 0.05, "sgd")
    k, v, _ = clients[0].dump()
    rk, rv, _ = ref.dump()
    assert np.array_equal(k, rk) and np.array_equal(bits(v), bits(rv))


def test_a_rank_closing_with_steps_held_keeps_the_session(cluster_factory):
    cl = cluster_factory(num_shards=1, dim=DIM).client()
    k, g = np.arange(3, dtype=np.int64), np.ones((3, DIM), np.float32)
    cl.commit(9, 0, 0, 2, k, g, 0.1, max_ahead=2)
    cl.commit(9, 1, 0, 2, k, g, 0.1, max_ahead=2)
    cl.close_session(9, 0)  # steps pending: rank 1 still finishes them
    cl.commit(9, 0, 1, 2, k, g, 0.1, max_ahead=2)
    cl.commit(9, 1, 1, 2, k, g, 0.1, max_ahead=2)
    assert cl.committed_step(9) == 1
