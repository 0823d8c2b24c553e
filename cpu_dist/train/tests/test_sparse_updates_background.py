"""SparseUpdater(background=True) against a real in-process shard: the hand-off and its
follow-up run on the hand-off thread, every reader of the protocol's state drains it first,
and what the follow-up raises reaches the training thread at the next call."""

import threading

import numpy as np
import pytest
from mpi4py import MPI

from cpu_dist.sparse import Client, Server
from cpu_dist.train.sparse_updates import SparseUpdater

pytestmark = pytest.mark.timeout(60)
DIM = 4


@pytest.fixture
def shard():
    server = Server(DIM, "t", init_scale=0.1)
    server.start()
    yield Client([server.address], "t", DIM, timeout_s=10)
    server.stop(2)


@pytest.mark.parametrize("aggregation", ["ps", "collective"])
def test_hand_off_and_follow_up_run_in_the_background(shard, aggregation):
    up = SparseUpdater(
        shard,
        MPI.COMM_SELF,
        11,
        lr=0.5,
        optimizer="sgd",
        aggregation=aggregation,
        timeout_s=10,
        background=True,
    )
    assert up.background
    keys = np.array([2, 7, 9], dtype=np.int64)
    before = shard.pull(keys)
    ran_on = []
    up.submit(
        0,
        keys,
        np.ones((3, DIM), np.float32),
        then=lambda: ran_on.append(threading.current_thread().name),
    )
    up.wait_readable(1)  # drains the hand-off, then waits for commit 0
    assert ran_on and ran_on[0].startswith("sparse-submit")
    assert up.committed == 0
    np.testing.assert_array_equal(shard.pull(keys), before - np.float32(0.5))
    up.finish(0)


def test_an_error_in_the_follow_up_reaches_the_next_call(shard):
    up = SparseUpdater(
        shard, MPI.COMM_SELF, 12, lr=0.5, optimizer="sgd", timeout_s=10, background=True
    )
    keys = np.array([1], dtype=np.int64)

    def broken():
        raise RuntimeError("coherence failed")

    up.submit(0, keys, np.ones((1, DIM), np.float32), then=broken)
    with pytest.raises(RuntimeError, match="coherence failed"):
        up.submit(1, keys, np.ones((1, DIM), np.float32))
    # The protocol's state is unknown after a failed hand-off: every later call fails too.
    with pytest.raises(RuntimeError, match="coherence failed"):
        up.wait_readable(1)
