"""Sessions that outlive their job: idle sessions expire (session_idle_timeout_s), and a job
that takes the shards over aborts every open session before it loads a checkpoint.  Waits are
on the shard's own state (Stats polled with a deadline), never on a sleep."""

import threading

import numpy as np
import pytest

from cpu_dist.sparse import Client, PSError, Server

from .conftest import TOKEN, wait_until

pytestmark = pytest.mark.timeout(60)
DIM = 4
K, G = np.arange(3, dtype=np.int64), np.ones((3, DIM), np.float32)


class Waiter:
    """A thread in wait_committed; .error is what it raised."""

    def __init__(self, client, session: int, step: int):
        self.error: Exception | None = None
        self.t = threading.Thread(target=self._run, args=(client, session, step))
        self.t.start()

    def _run(self, client, session, step):
        try:
            client.wait_committed(session, step, 30.0)
        except Exception as e:  # checked by the test
            self.error = e

    def join(self) -> Exception | None:
        self.t.join(30)
        assert not self.t.is_alive()
        return self.error


def test_an_idle_session_expires_its_waiters_fail_and_it_stays_closed(cluster_factory):
    c = cluster_factory(num_shards=1, dim=DIM, session_idle_timeout_s=0.5)
    cl = c.client()
    cl.commit(3, 0, 0, 1, K, G, 0.1)  # step 0 applied
    cl.commit(3, 1, 0, 1, K, G, 0.1)  # step 1 applied
    cl.commit(4, 0, 0, 2, K, G, 0.1)  # a crashed job's session: rank 1 never comes
    waiter = Waiter(c.client(), 4, 0)
    wait_until(lambda: cl.stats()[0]["sessions"] == 0, what="both sessions expire")
    err = waiter.join()
    assert isinstance(err, PSError)
    want = "FAILED_PRECONDITION: session 4 is closed (committed step -1): expired after 0.5 s"
    assert want in str(err)
    with pytest.raises(PSError, match="session 4 is closed"):  # never re-created
        cl.commit(4, 0, 1, 2, K, G, 0.1)
    assert cl.committed_step(3) == 1  # an expired session's last step is remembered
    assert c.rows() == 3  # session 4's pending chunk was dropped, not applied


def test_sessions_never_expire_by_default(cluster_factory):
    c = cluster_factory(num_shards=1, dim=DIM)
    cl = c.client()
    cl.commit(5, 0, 0, 2, K, G, 0.1)
    assert cl.stats()[0]["sessions"] == 1
    assert Server(DIM, TOKEN, init_scale=0.1).stats()["sessions"] == 0


def test_idle_timeout_is_checked(cluster_factory):
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="session_idle_timeout_s must be >= 0"):
            Server(DIM, TOKEN, init_scale=0.1, session_idle_timeout_s=bad)


def test_abort_sessions_then_load(tmp_path):
    srv = Server(DIM, TOKEN, init_scale=0.1, seed=2, checkpoint_dir=str(tmp_path))
    srv.start()
    try:
        cl = srv_client(srv)
        cl.push(K, G, 0.5)
        saved = cl.pull(K)
        cl.save(["ck.bin"], 0)
        cl.commit(6, 0, 0, 2, K, G, 0.1)  # a crashed job's open session, step 0 pending
        cl.commit(7, 0, 0, 1, K, G, 0.1)  # another one, step 0 applied
        with pytest.raises(PSError, match="FAILED_PRECONDITION: a commit session is open"):
            cl.load(["ck.bin"])
        waiter = Waiter(srv_client(srv), 6, 0)
        wait_until(lambda: srv.stats()["waiters"] == 1, what="the waiter is parked")
        assert cl.abort_sessions() == [{"aborted": 2}]
        err = waiter.join()
        assert isinstance(err, PSError) and "ABORTED: session 6 is closed" in str(err)
        assert "aborted by AbortSessions" in str(err)
        assert cl.load(["ck.bin"])[0]["rows"] == 3
        assert np.array_equal(cl.pull(K), saved)  # step 7's update is gone with the load
        with pytest.raises(PSError, match=r"ABORTED: session 6 is closed .*AbortSessions"):
            cl.commit(6, 0, 1, 2, K, G, 0.1)  # the old job's late chunk changes nothing
        assert np.array_equal(cl.pull(K), saved)
        assert cl.abort_sessions() == [{"aborted": 0}]
    finally:
        srv.stop(2.0)


def srv_client(srv: Server) -> Client:
    return Client([srv.address], TOKEN, DIM, timeout_s=20.0)
