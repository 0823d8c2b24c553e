"""Asynchronous sparse commits with bounded staleness (real ranks, real shards): workers that
run at different speeds never wait for each other beyond K steps, yet every step is applied
exactly once with every worker's gradients (SGD is linear, so the final rows say how often
each step's sum was applied), and the reads saw at most K missing commits.

The last worker is the slow one.  It is not slowed with a sleep: it waits (``Progress``, with
a timeout) until the other workers have got as far ahead as the test wants, and the test
asserts on the fast workers' reads that they did run ahead of its commits."""

import numpy as np
import pytest

from cpu_dist.common.contracts import TABLE
from cpu_dist.common.timing import PhaseTimer
from cpu_dist.sparse import Client, row_init
from cpu_dist.sparse.aggregation import make_aggregation
from cpu_dist.sparse.commits import CommitSession, SparseCommitter, make_handoff
from cpu_dist.sparse.reads import TableReads
from cpu_dist.train.pipelines import AsyncPrefetchPipeline

from .cluster import end_job, start_job
from .progress import Progress

pytestmark = [pytest.mark.mpi(min_size=3), pytest.mark.timeout(120)]
DIM, SEED, SCALE, LR, STEPS, K = 4, 9, 0.1, 0.125, 12, 2


def grad(rank: int, step: int) -> float:
    return float(1 + rank + 3 * step)  # distinct per (rank, step): a lost or doubled one shows


class HeldSession(CommitSession):
    """The slow worker's chunks of step t leave only once every other worker has read step
    t+1 (``progress``): the fast workers' reads then run ahead of its commit t for certain."""

    progress: Progress | None = None

    def send(self, step, keys, grads, **kw):
        if self.progress is not None and self.rank == self.progress.watcher:
            self.progress.wait_for_others(min(step + 1, STEPS - 1))
        return super().send(step, keys, grads, **kw)


def committer(k: int, exchange_ids: bool = False):
    """On a fresh job: (roles, client, this worker's SGD committer with staleness k), or None
    on the PS ranks."""
    job = start_job(DIM, SEED, SCALE)
    if job is None:
        return None
    roles, token, session_id, addresses = job
    client = Client(addresses, token, DIM)
    W, r = roles.role_size, roles.role_rank
    session = HeldSession(client, session_id, r, W, lr=LR, optimizer="sgd", barrier_timeout_s=60)
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
    progress = Progress(roles.comm, watcher=W - 1, timeout_s=60)
    for step in range(STEPS):
        up.wait_for_read(step)
        if r == W - 1:  # the slow worker: the others first run ahead as far as K allows
            progress.wait_for_others(min(step + k, STEPS - 1))
        up.submit(step, keys, np.full((40, DIM), grad(r, step), np.float32))
        if r != W - 1:
            progress.reached(step)
    up.finish(STEPS - 1)
    progress.close()
    m = up.metrics()
    assert m["staleness_max"] <= k
    # The fast workers ran as far ahead of the slow worker's chunks as K allows: the read of
    # step t missed exactly min(t, K) commits (the slow worker had sent every earlier step).
    fast = roles.comm.allgather(None if r == W - 1 else up.staleness_seen)
    for seen in fast[:-1]:
        assert seen == [min(t, k) for t in range(STEPS)], seen
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
    # submit's id allgather keeps every worker within a step of the others: the slow one
    # holds back its chunks instead (HeldSession), until the others have read the next step.
    progress = up.session.progress = Progress(roles.comm, watcher=W - 1, timeout_s=60)
    reads = TableReads(client, [TABLE], one_table=True)  # the default job's one table
    pipe = AsyncPrefetchPipeline(reads, up, PhaseTimer(), {TABLE: DIM}, 60.0)
    read = np.arange(60, dtype=np.int64)  # rows 40..59 are read, never written: pulled early
    init = row_init(SEED, read, DIM, SCALE).astype(np.float64)
    # the rows after commits 0..n-1: distinct for every n, since every step adds a new sum
    sums = np.cumsum([0.0] + [sum(grad(w, t) for w in range(W)) / W for t in range(STEPS)])
    held = []
    for step in range(STEPS):
        rows = pipe.read(step, {TABLE: read})[TABLE].numpy().astype(np.float64)
        assert np.array_equal(rows[40:], init[40:])
        n = np.abs((init[:40, :1] - rows[:40, :1]) / LR - sums[None, :]).argmin(axis=1)
        held.append(int(n.min()))
        if r != W - 1:
            progress.reached(step)  # read: the slow worker's chunks of step-1 may leave
        pipe.submit(step, {TABLE: keys}, {TABLE: np.full((40, DIM), grad(r, step), np.float32)})
        if step + 1 < STEPS:
            pipe.prefetch(step + 1, {TABLE: read})
    pipe.finish(STEPS - 1)
    progress.close()
    assert all(n >= step - K for step, n in enumerate(held)), held  # commits <= step-1-K
    m = up.metrics()
    assert len(up.staleness_seen) == STEPS and m["staleness_max"] <= K
    if r != W - 1:  # every read after step 0 ran ahead of the slow worker's commit step-1
        assert all(n < step for step, n in enumerate(held) if step), held
        assert all(x >= 1 for x in up.staleness_seen[1:]), up.staleness_seen
    assert pipe.reads_early + pipe.reads_again == STEPS - 1  # step 0 had no early pull
    assert roles.comm.allreduce(pipe.reads_early) >= 1  # the early rows were used
    np.testing.assert_allclose(
        client.pull(keys), (init[:40] - LR * sums[-1]).astype(np.float32), rtol=1e-5
    )
    end_job(roles, client)
