"""Real PS ranks and real workers under mpirun: concurrent pulls and pushes, checked in numpy.

Run: mpirun -np 3 (or 4) python -m pytest --with-mpi --only-mpi tests/mpi
The last rank is a PS shard with 3 ranks, the last two with 4; the rest are workers.
"""

from __future__ import annotations

import numpy as np
import pytest

from cpu_dist.common.mpi_context import wait_all
from cpu_dist.sparse import Client, row_init

from .cluster import end_job, start_job

pytestmark = [pytest.mark.mpi(min_size=3), pytest.mark.timeout(120)]
DIM, SEED, SCALE, LR = 16, 7, 0.1, 0.05


def test_concurrent_push_pull_matches_numpy():
    job = start_job(DIM, SEED, SCALE)
    if job is None:
        return
    roles, token, _, addresses = job
    client = Client(addresses, token, DIM, max_keys_per_rpc=7)
    w, W = roles.role_rank, roles.role_size
    # Every worker pushes to a shared key range (overlapping) and to keys of its own, several
    # rounds, concurrently with the others; SGD is linear so the final rows are known exactly
    # up to float rounding: init - lr * sum of all gradients.
    shared = np.arange(100, 140, dtype=np.int64)
    own = np.arange(10_000 * (w + 1), 10_000 * (w + 1) + 25, dtype=np.int64)
    rng = np.random.default_rng(w)
    rounds = 5
    for r in range(rounds):
        keys = np.concatenate([shared, own, shared[:3]])  # duplicates inside one push
        grads = np.full((len(keys), DIM), float(w + 1 + r), dtype=np.float32)
        handle = client.push_async(keys, grads, LR)
        pulled = client.pull(rng.permutation(np.concatenate([shared, own])))
        assert pulled.shape == (len(shared) + len(own), DIM)
        handle.wait(30)
    wait_all(roles.comm, 60, "pushes done")

    got = client.pull(shared)
    # shared[:3] get each push twice; each worker w pushes value (w+1+r) in round r.
    total = sum((ww + 1 + r) for ww in range(W) for r in range(rounds))
    expect = row_init(SEED, shared, DIM, SCALE).astype(np.float64)
    mult = np.ones(len(shared))
    mult[:3] = 2
    expect = expect - LR * total * mult[:, None]
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)
    mine = client.pull(own)
    own_total = sum(w + 1 + r for r in range(rounds))
    np.testing.assert_allclose(
        mine, row_init(SEED, own, DIM, SCALE) - LR * own_total, rtol=1e-5, atol=1e-5
    )
    # Rows every worker never pushed stay at their init and are not created by pulls.
    untouched = np.array([999_999_999], dtype=np.int64)
    np.testing.assert_array_equal(client.pull(untouched), row_init(SEED, untouched, DIM, SCALE))
    stats = client.stats()
    assert sum(s["rows"] for s in stats) == len(shared) + 25 * W
    end_job(roles, client)


def test_commit_protocol_sums_every_worker_once():
    job = start_job(DIM, SEED, SCALE)
    if job is None:
        return
    roles, token, session, addresses = job
    client = Client(addresses, token, DIM, max_keys_per_rpc=5)
    w, W = roles.role_rank, roles.role_size
    keys = np.arange(50, dtype=np.int64)
    steps = 4
    for step in range(steps):
        # worker w touches every key of its residue class, plus key 0 for all; the last worker
        # sends nothing in step 1 (an empty-rank marker).
        mine = keys[(keys % W == w) | (keys == 0)]
        if step == 1 and w == W - 1:
            mine = mine[:0]
        grads = np.full((len(mine), DIM), float(w + 1), dtype=np.float32)
        client.commit(session, step, w, W, mine, grads, LR, "rowwise_adagrad")
        assert client.wait_committed(session, step, 30) >= step
    # numpy: per step, g(key) = sum over workers touching it of (w+1), divided by W.
    expect = row_init(SEED, keys, DIM, SCALE).astype(np.float32)
    acc = np.zeros(len(keys), dtype=np.float32)
    for step in range(steps):
        g = np.zeros(len(keys), dtype=np.float32)
        for ww in range(W):
            touch = (keys % W == ww) | (keys == 0)
            if step == 1 and ww == W - 1:
                touch[:] = False
            g[touch] += ww + 1
        g /= np.float32(W)
        touched = np.zeros(len(keys), dtype=bool)
        for ww in range(W):
            if not (step == 1 and ww == W - 1):
                touched |= (keys % W == ww) | (keys == 0)
        acc[touched] += g[touched] ** 2  # mean over columns of g^2 (all columns equal)
        step_size = np.float32(LR) / (np.sqrt(acc) + np.float32(1e-8))
        expect[touched] -= (step_size * g)[touched, None]
    np.testing.assert_allclose(client.pull(keys), expect, rtol=1e-5)
    client.close_session(session, w)
    end_job(roles, client)
