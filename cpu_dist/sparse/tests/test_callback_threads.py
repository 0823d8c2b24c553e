"""gRPC's callback threads never block: calls that wait on the table's update lock (a Commit
or a Push while a Save freezes the table) wait on the shard's own threads, so pulls, stats and
long polls are still served.  The Save is held at a test hook with the table frozen."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cpu_dist.sparse import Client, _ps

from .conftest import TOKEN

pytestmark = pytest.mark.timeout(120)

DIM = 8
HOLD = "save_frozen"
WAITING_CALLS = 64  # more than gRPC keeps callback threads


def test_a_pull_completes_while_updates_wait_on_a_held_save(cluster_factory, tmp_path):
    cluster = cluster_factory(1, DIM, test_hooks=True, checkpoint_dir=str(tmp_path))
    server = cluster.servers[0]
    cl = cluster.client(timeout_s=60.0)
    keys = np.arange(32, dtype=np.int64)
    grads = np.ones((len(keys), DIM), np.float32)
    cl.push(keys, grads, 0.1, "sgd")
    server.test_hold(HOLD)
    saved: list[object] = []
    saver = threading.Thread(target=lambda: saved.append(cl.save(["ckpt.bin"], 0)))
    saver.start()
    handles = []
    try:
        assert server.test_wait_held(HOLD, 20)
        # Each a whole step of its own session (world 1): applying waits for the freeze.
        handles = [
            cl.commit_async(session, 0, 0, 1, keys, grads, 0.1, "sgd")
            for session in range(1, WAITING_CALLS + 1)
        ]
        handles += [cl.push_async(keys, grads, 0.1, "sgd") for _ in range(8)]
        quick = Client(cluster.addresses, TOKEN, DIM, timeout_s=5.0)
        rows = quick.pull(keys)  # DEADLINE_EXCEEDED when the callback threads are all waiting
        np.testing.assert_array_equal(rows, cluster.client().pull(keys))
        assert quick.stats()[0]["rows"] == len(keys)
        assert not any(h.done() for h in handles)  # the updates still wait for the Save
    finally:
        server.test_release(HOLD)
        saver.join(60)
    assert saved and saved[0][0]["rows"] == len(keys)
    for h in handles:
        h.wait(60)
    # Every deferred update applied once: the commits of all sessions and the pushes.
    assert all(cl.committed_step(session) == 0 for session in range(1, WAITING_CALLS + 1))
    want = rows.copy()
    for _ in range(len(handles)):
        _ps.apply_rows(want, grads, 0.1, "sgd")
    np.testing.assert_array_equal(cl.pull(keys), want)
