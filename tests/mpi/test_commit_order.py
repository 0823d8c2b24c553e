"""Commit order with a background hand-off (the cache stage's): when one worker's step-t chunk
is late, another worker whose reads waited for nothing must not send step t+1 before commit t,
or the shard refuses it as out of order and the job dies (real ranks, real shards).

The late worker is not slowed with a sleep: its chunks of step 0 leave only once every other
worker's hand-off of step 1 is ready to go and waiting for commit 0 (``Progress``), so the
overtaking case happens in every run, and the test asserts that it did and what followed."""

import numpy as np
import pytest

from cpu_dist.sparse import Client, row_init
from cpu_dist.sparse.aggregation import make_aggregation
from cpu_dist.sparse.commits import CommitSession, SparseCommitter, make_handoff

from .cluster import end_job, start_job
from .progress import Progress

pytestmark = [pytest.mark.mpi(min_size=3), pytest.mark.timeout(120)]
DIM, SEED, SCALE, LR, STEPS, LATE = 4, 5, 0.1, 0.25, 3, 1


class LateSession(CommitSession):
    """Worker LATE's chunks of step 0 leave late, as over a slow link; every worker records,
    per step, the last commit it knew applied when its chunks left."""

    def __init__(self, *args, progress: Progress, **kw):
        super().__init__(*args, **kw)
        self.progress = progress
        self.sent_after: dict[int, int] = {}
        self.ahead: dict[int, int] = {}  # on LATE: the step each other worker was ready to send
        self.ready = False

    def wait_applied(self, step, refresh=False):
        if self.rank != LATE and step == 0 and not self.ready:
            # the hand-off of step 1, about to wait for commit 0: step 1 is ready to overtake
            self.ready = True
            self.progress.reached(1)
        super().wait_applied(step, refresh)

    def send(self, step, keys, grads, **kw):
        if self.rank == LATE and step == 0:
            self.ahead = self.progress.wait_for_others(1)
        self.sent_after[step] = self.committed
        return super().send(step, keys, grads, **kw)


def test_a_late_chunk_does_not_let_the_next_step_overtake_it():
    job = start_job(DIM, SEED, SCALE)
    if job is None:
        return
    roles, token, session_id, addresses = job
    client = Client(addresses, token, DIM)
    W, r = roles.role_size, roles.role_rank
    keys = np.arange(32, dtype=np.int64)
    progress = Progress(roles.comm, watcher=LATE, timeout_s=60)
    session = LateSession(
        client,
        session_id,
        r,
        W,
        lr=LR,
        optimizer="sgd",
        barrier_timeout_s=60,
        progress=progress,
    )
    up = SparseCommitter(
        session,
        make_aggregation("ps", roles.comm),
        make_handoff("pipelined", session, 60),
        background=True,
    )
    for step in range(STEPS):  # all hits: the reads wait for no commit, only for the hand-off
        up.drain()
        up.submit(step, keys, np.full((32, DIM), r + 1.0, np.float32))
    up.finish(STEPS - 1)
    progress.close()
    if r == LATE:  # every other worker had step 1 ready before this one's step 0 left
        assert sorted(session.ahead) == [w for w in range(W) if w != LATE], session.ahead
        assert all(s >= 1 for s in session.ahead.values()), session.ahead
    else:  # ...and still sent it only after commit 0, each step after the one before
        assert session.ready
    assert all(session.sent_after[t] >= t - 1 for t in range(STEPS)), session.sent_after
    mean = sum(range(1, W + 1)) / W
    np.testing.assert_allclose(
        client.pull(keys), row_init(SEED, keys, DIM, SCALE) - STEPS * mean * LR, rtol=1e-5
    )
    end_job(roles, client)
