"""Asynchronous sparse commits with bounded staleness (real ranks, real shards): workers that
run at different speeds never wait for each other beyond K steps, yet every step is applied
exactly once with every worker's gradients (SGD is linear, so the final rows say how often
each step's sum was applied), and the reads saw at most K missing commits."""

import time

import numpy as np
import pytest
from mpi4py import MPI

from cpu_dist.common.timing import PhaseTimer
from cpu_dist.sparse import Client, row_init
from cpu_dist.sparse.aggregation import make_aggregation
from cpu_dist.sparse.commits import CommitSession, SparseCommitter, make_handoff
from cpu_dist.train.pipelines import AsyncPrefetchPipeline

from .cluster import end_job, start_job

pytestmark = [pytest.mark.mpi(min_size=3), pytest.mark.timeout(120)]
DIM, SEED, SCALE, LR, STEPS, K = 4, 9, 0.1, 0.125, 12, 2


def grad(rank: int, step: int) -> float:
    return float(1 + rank + 3 * step)  # distinct per (rank, step): a lost or doubled one shows


def committer(k: int, exchange_ids: bool = False):
    """On a fresh job: (roles, client, this worker's SGD committer with staleness k), or None
    on the PS ranks."""
    job = start_job(DIM, SEED, SCALE)
    if job is None:
        return None
    roles, token, session_id, addresses = job
    client = Client(addresses, token, DIM)
    W, r = roles.role_size, roles.role_rank
    session = CommitSession(client, session_id, r, W, lr=LR, optimizer="sgd", barrier_timeout_s=60)
    up = SparseCommitter(
        session,
        make_aggregation("ps", roles.comm, exchange_ids=exchange_ids),
        make_handoff("async" if k else "pipelined", session, 60, staleness=k),
    )
    return roles, client, up


@pytest.mark.parametrize("k", [0, K])
def test_every_step_is_applied_once_with_every_workers_chunks(k):
    made = committer(k)
    if made is None:
        return
    roles, client, up = made
    W, r = roles.role_size, roles.role_rank
    keys = np.arange(40, dtype=np.int64)
    for step in range(STEPS):
        up.wait_for_read(step)
        if r == W - 1:
            time.sleep(0.02)  # an injected slow worker: the others run ahead, up to K steps
        up.submit(step, keys, np.full((40, DIM), grad(r, step), np.float32))
    up.finish(STEPS - 1)
    m = up.metrics()
    assert m["staleness_max"] <= k
    if k:  # the fast workers did run ahead of the slow one
        assert roles.comm.allreduce(m["staleness_max"], op=MPI.MAX) >= 1
    total = sum(grad(w, t) for w in range(W) for t in range(STEPS)) / W
    np.testing.assert_allclose(
        client.pull(keys), row_init(SEED, keys, DIM, SCALE) - np.float32(LR) * total, rtol=1e-5
    )
    end_job(roles, client)


def test_early_pulls_hold_every_commit_the_async_rule_needs():
    """AsyncPrefetchPipeline pulls step t+1's rows during step t; what a read returns must
    still hold every commit up to t-1-K (else the pipeline waits and pulls again)."""
    made = committer(K, exchange_ids=True)
    if made is None:
        return
    roles, client, up = made
    W, r = roles.role_size, roles.role_rank
    keys = np.arange(40, dtype=np.int64)
    pipe = AsyncPrefetchPipeline(client, up, PhaseTimer(), 60.0, writes_known=True)
    read = np.arange(60, dtype=np.int64)  # rows 40..59 are read, never written: pulled early
    init = row_init(SEED, read, DIM, SCALE).astype(np.float64)
    # the rows after commits 0..n-1: distinct for every n, since every step adds a new sum
    sums = np.cumsum([0.0] + [sum(grad(w, t) for w in range(W)) / W for t in range(STEPS)])
    held = []
    for step in range(STEPS):
        rows = pipe.read(step, read).numpy().astype(np.float64)
        assert np.array_equal(rows[40:], init[40:])
        n = np.abs((init[:40, :1] - rows[:40, :1]) / LR - sums[None, :]).argmin(axis=1)
        held.append(int(n.min()))
        if r == W - 1:
            time.sleep(0.02)  # a slow worker: the others read ahead of its commits
        pipe.submit(step, keys, np.full((40, DIM), grad(r, step), np.float32))
        if step + 1 < STEPS:
            pipe.prefetch(step + 1, read)
    pipe.finish(STEPS - 1)
    assert all(n >= step - K for step, n in enumerate(held)), held  # commits <= step-1-K
    m = up.metrics()
    assert len(up.staleness_seen) == STEPS and m["staleness_max"] <= K
    assert pipe.reads_early + pipe.reads_again == STEPS - 1  # step 0 had no early pull
    assert roles.comm.allreduce(pipe.reads_early) >= 1  # the early rows were used
    np.testing.assert_allclose(
        client.pull(keys), (init[:40] - LR * sums[-1]).astype(np.float32), rtol=1e-5
    )
    end_job(roles, client)
