"""Commit order with a background hand-off (the cache stage's): when one worker's step-t chunk
is late, another worker whose reads waited for nothing must not send step t+1 before commit t,
or the shard refuses it as out of order and the job dies (real ranks, real shards)."""

import time

import numpy as np
import pytest

from cpu_dist.sparse import Client, row_init
from cpu_dist.sparse.aggregation import make_aggregation
from cpu_dist.sparse.commits import CommitSession, SparseCommitter, make_handoff

from .cluster import end_job, start_job

pytestmark = [pytest.mark.mpi(min_size=3), pytest.mark.timeout(120)]
DIM, SEED, SCALE, LR, DELAY_S = 4, 5, 0.1, 0.25, 0.5


class LateSession(CommitSession):
    """Rank 1's chunks of step 0 leave late (an injected delay, as a slow link would)."""

    def send(self, step, keys, grads, **kw):
        if self.rank == 1 and step == 0:
            time.sleep(DELAY_S)
        return super().send(step, keys, grads, **kw)


def test_a_late_chunk_does_not_let_the_next_step_overtake_it():
    job = start_job(DIM, SEED, SCALE)
    if job is None:
        return
    roles, token, session_id, addresses = job
    client = Client(addresses, token, DIM)
    W, r = roles.role_size, roles.role_rank
    keys = np.arange(32, dtype=np.int64)
    session = LateSession(client, session_id, r, W, lr=LR, optimizer="sgd", barrier_timeout_s=60)
    up = SparseCommitter(
        session,
        make_aggregation("ps", roles.comm),
        make_handoff("pipelined", session, 60),
        background=True,
    )
    for step in range(3):  # all hits: the reads wait for no commit, only for the hand-off
        up.drain()
        up.submit(step, keys, np.full((32, DIM), r + 1.0, np.float32))
    up.finish(2)
    mean = sum(range(1, W + 1)) / W
    np.testing.assert_allclose(
        client.pull(keys), row_init(SEED, keys, DIM, SCALE) - 3 * mean * LR, rtol=1e-5
    )
    end_job(roles, client)
