"""Finishing the sparse committer drains the commit still in flight (real ranks, real shards)."""

import numpy as np
import pytest

from cpu_dist.sparse import Client, row_init
from cpu_dist.sparse.aggregation import make_aggregation
from cpu_dist.sparse.commits import CommitSession, SparseCommitter, make_handoff

from .cluster import end_job, start_job

pytestmark = [pytest.mark.mpi(min_size=3), pytest.mark.timeout(120)]
DIM, SEED, SCALE = 4, 3, 0.1


@pytest.mark.parametrize("aggregation", ["ps", "collective"])
def test_finish_drains_in_flight_commit(aggregation):
    job = start_job(DIM, SEED, SCALE)
    if job is None:
        return
    roles, token, session_id, addresses = job
    client = Client(addresses, token, DIM, max_keys_per_rpc=8)
    W, r = roles.role_size, roles.role_rank
    keys = np.arange(64, dtype=np.int64)
    session = CommitSession(
        client, session_id, r, W, lr=0.25, optimizer="sgd", barrier_timeout_s=60
    )
    up = SparseCommitter(
        session, make_aggregation(aggregation, roles.comm), make_handoff("pipelined", session, 60)
    )
    for step in range(5):
        up.wait_readable(step)
        up.submit(step, keys, np.full((64, DIM), r + 1.0, np.float32))
    assert up.handoff.in_flight  # step 4's commit is still in flight here...
    up.finish(4)  # ...and finish waits for it, then closes the session
    assert not up.handoff.in_flight
    mean = sum(range(1, W + 1)) / W
    np.testing.assert_allclose(
        client.pull(keys), row_init(SEED, keys, DIM, SCALE) - 5 * mean * 0.25, rtol=1e-5
    )
    end_job(roles, client)
