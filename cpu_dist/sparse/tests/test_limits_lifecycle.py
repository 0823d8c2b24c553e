"""Limits on what the wire may make a shard allocate, sessions that end (closed, failed),
all-or-nothing application, and the Python layer's timeouts and blocking teardown."""

import math
import socket
import threading
import time

import grpc
import numpy as np
import pytest

from cpu_dist.sparse import Client, PSError, Server, row_init
from cpu_dist.sparse.grpc_stubs import token_channel

from .conftest import TOKEN

pytestmark = pytest.mark.timeout(60)
DIM = 4


def commit_req(pb, **kw):
    base = dict(
        table=b"embedding",
        session=1,
        step=0,
        rank=0,
        world_size=1,
        chunk_index=0,
        chunk_count=1,
        dim=DIM,
        lr=0.1,
    )
    base.update(kw)
    return pb.CommitRequest(**base)


@pytest.fixture
def raw(cluster_factory, pb):
    """(cluster, client, raw stub, ps_pb2) on one shard."""
    c = cluster_factory(num_shards=1, dim=DIM)
    channel = token_channel(c.addresses[0], TOKEN)
    yield c, c.client(), pb[1].ParameterServerStub(channel), pb[0]
    channel.close()


# ---- D1: world_size / chunk_count / live sessions ------------------------------------------


def test_big_world_size_costs_no_memory_up_front(raw):
    _c, cl, stub, pb = raw
    rss = cl.stats()[0]["resident_bytes"]
    for session in range(3):  # the reviewer's 20M x 3 grew RSS by 1.8 GB; the cap is 2^16
        stub.Commit(
            commit_req(
                pb,
                session=100 + session,
                world_size=1 << 16,
                rank=5,
                chunk_count=1 << 20,
                chunk_index=(1 << 20) - 1,
            ),
            timeout=10,
        )
    assert cl.stats()[0]["resident_bytes"] - rss < 32 << 20
    assert cl.committed_step(100) == -1


def test_live_sessions_are_capped_and_the_least_recently_active_makes_room(cluster_factory):
    c = cluster_factory(num_shards=1, dim=DIM, max_sessions=4)
    cl = c.client()
    k, g = np.arange(3, dtype=np.int64), np.ones((3, DIM), np.float32)
    for session in (40, 30, 20, 10):  # created in this order; smallest id last
        cl.commit(session, 0, 0, 2, k, g, 0.1)  # each pending: rank 1 missing
    cl.commit(40, 0, 0, 2, k, g, 0.1)  # a retry: session 40 is active again
    assert cl.stats()[0]["sessions"] == 4
    cl.commit(50, 0, 0, 1, k, g, 0.1)  # a fifth session: the least recently active goes
    assert cl.stats()[0]["sessions"] == 4
    with pytest.raises(PSError, match=r"session 30 is closed .*: evicted, the least recently"):
        cl.commit(30, 0, 1, 2, k, g, 0.1)
    for session in (40, 20, 10):  # still live: their steps complete
        cl.commit(session, 0, 1, 2, k, g, 0.1)
        assert cl.committed_step(session) == 0
    assert cl.committed_step(50) == 0


# ---- D2: oversized pull replies --------------------------------------------------------------


def test_pull_reply_over_the_limit_is_refused_before_it_is_built(cluster_factory, pb):
    c = cluster_factory(num_shards=1, dim=64, max_message_bytes=1 << 20)
    stub = pb[1].ParameterServerStub(token_channel(c.addresses[0], TOKEN))
    cl = c.client(max_keys_per_rpc=1024)
    errors = cl.stats()[0]["errors"]
    n = 5000  # request 40 KB, reply 1.28 MB > 1 MiB
    req = pb[0].PullRequest(table=b"embedding", dim=64, keys=np.arange(n, dtype=np.int64).tobytes())
    with pytest.raises(grpc.RpcError) as ei:
        stub.Pull(req, timeout=10)
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (
        "Pull reply of 1280004 bytes (5000 keys x dim 64 x 4) exceeds max_message_bytes 1048576"
    ) in ei.value.details()
    assert cl.stats()[0]["errors"] == errors + 1
    assert cl.pull(np.arange(n, dtype=np.int64)).shape == (n, 64)  # our client splits it


def test_client_refuses_rpcs_that_cannot_fit(cluster_factory):
    c = cluster_factory(num_shards=1, dim=64)
    with pytest.raises(ValueError, match=r"max_keys_per_rpc 8192 .* max_message_bytes 1048576"):
        Client(c.addresses, TOKEN, 64, max_keys_per_rpc=8192, max_message_bytes=1 << 20)
    Client(c.addresses, TOKEN, 64, max_keys_per_rpc=3000, max_message_bytes=1 << 20).close()


# ---- D3 / D5 / D6: closed sessions --------------------------------------------------------


def test_chunk_after_all_ranks_closed_is_refused(raw):
    c, cl, _stub, _pb = raw
    k, g = np.arange(3, dtype=np.int64), np.ones((3, DIM), np.float32)
    cl.commit(7, 0, 0, 2, k, g, 0.1)  # pending: rank 1 missing
    cl.close_session(7, 0)
    cl.close_session(7, 1)  # all closed: dropped with its pending step
    with pytest.raises(PSError, match="FAILED_PRECONDITION: session 7 is closed"):
        cl.commit(7, 0, 1, 2, k, g, 0.1)
    assert c.rows() == 0 and cl.committed_step(7) == -1


def test_close_wakes_long_polls(raw):
    c, cl, _stub, _pb = raw
    k, g = np.arange(3, dtype=np.int64), np.ones((3, DIM), np.float32)
    cl.commit(9, 0, 0, 2, k, g, 0.1)
    waiter = c.client()
    out = []

    def wait():
        t0 = time.monotonic()
        try:
            waiter.wait_committed(9, 0, 30.0)
        except Exception as e:  # checked below
            out.append((e, time.monotonic() - t0))

    t = threading.Thread(target=wait)
    t.start()
    cl.close_session(9, 0)
    cl.close_session(9, 1)
    t.join(20)
    assert not t.is_alive()
    ((err, took),) = out
    assert isinstance(err, PSError) and "FAILED_PRECONDITION: session 9 is closed" in str(err)
    assert took < 10.0  # not the 30 s deadline
    with pytest.raises(PSError, match="session 9 is closed"):  # and a late waiter at once
        waiter.wait_committed(9, 0, 30.0)


def test_closing_a_session_that_never_committed_is_fine(raw):
    _c, cl, _stub, _pb = raw
    cl.close_session(424242, 0)  # SparseUpdater.finish(-1): a job with zero steps
    cl.close_session(424242, 3)
    assert cl.committed_step(424242) == -1


# ---- D4 / D7: a full stripe; all-or-nothing application ------------------------------------


@pytest.fixture
def small(cluster_factory):
    # One 64-row block per stripe: 16 x 64 rows fit in all.
    c = cluster_factory(num_shards=1, dim=DIM, max_blocks_per_stripe=1)
    return c, c.client()


def _ten_rows(cl):
    """Ten rows already in the table, and their values."""
    old = np.arange(10, dtype=np.int64)
    cl.push(old, np.ones((10, DIM), np.float32), 0.5)
    return old, cl.pull(old)


def test_full_stripe_refuses_push_and_changes_no_value(small):
    c, cl = small
    old, before = _ten_rows(cl)
    keys = np.arange(5000, dtype=np.int64)
    with pytest.raises(PSError, match="RESOURCE_EXHAUSTED: table stripe full"):
        cl.push(keys, np.ones((5000, DIM), np.float32), 0.5)
    assert np.array_equal(cl.pull(old), before)  # existing rows: not updated
    rest = keys[10:]
    assert np.array_equal(cl.pull(rest), row_init(c.seed, rest, DIM, c.init_scale))
    cl.push(old, np.ones((10, DIM), np.float32), 0.5)  # still serving
    assert not np.array_equal(cl.pull(old), before)


def test_step_that_cannot_apply_fails_the_session_whole(small):
    _c, cl = small
    old, before = _ten_rows(cl)
    keys = np.arange(5000, dtype=np.int64)
    g = np.ones((5000, DIM), np.float32)
    cl.commit(3, 0, 0, 2, keys, g, 0.5)  # accepted; rank 1 completes the step
    with pytest.raises(PSError, match="RESOURCE_EXHAUSTED: session 3 step 0 was not applied"):
        cl.commit(3, 0, 1, 2, old, g[:10], 0.5)
    assert np.array_equal(cl.pull(old), before)
    # The session is dead, not stuck: every later chunk and waiter hears why at once.
    with pytest.raises(PSError, match="session 3 step 0 was not applied"):
        cl.commit(3, 0, 1, 2, old, g[:10], 0.5)
    with pytest.raises(PSError, match="session 3 step 0 was not applied"):
        cl.wait_committed(3, 0, 30.0)
    cl.close_session(3, 0)  # a failed session is dropped at the first close
    with pytest.raises(PSError, match="session 3 is closed"):
        cl.commit(3, 0, 1, 2, old, g[:10], 0.5)


# ---- H1 / H2: timeouts from Python ---------------------------------------------------------


def test_timeouts_nan_refused_inf_waits(raw):
    c, cl, _stub, _pb = raw
    k, g = np.arange(3, dtype=np.int64), np.ones((3, DIM), np.float32)
    h = cl.commit_async(11, 0, 0, 1, k, g, 0.1)
    for call in (
        lambda: cl.wait_committed(11, 0, math.nan),
        lambda: h.wait(math.nan),
        lambda: c.servers[0].wait(math.nan),
    ):
        with pytest.raises(ValueError, match="NaN"):
            call()
    h.wait(math.inf)
    assert cl.wait_committed(11, 0, math.inf) == 0
    t0 = time.monotonic()
    try:  # negative: don't wait (done or TimeoutError at once), never "forever"
        cl.wait_committed(11, 1, -5.0)
    except TimeoutError:
        pass
    assert time.monotonic() - t0 < 5.0
    assert c.servers[0].wait(-1.0) is False  # negative: returns at once
    got = []
    t = threading.Thread(target=lambda: got.append(c.servers[0].wait(math.inf)))
    t.start()
    t.join(0.3)
    assert t.is_alive(), "wait(inf) returned before the server stopped"
    c.servers[0].stop(2.0)
    t.join(10)
    assert got == [True]


def test_wait_before_start_raises():
    srv = Server(DIM, TOKEN, init_scale=0.1)
    with pytest.raises(RuntimeError, match="not started"):
        srv.wait(None)


# ---- G1: blocking teardown releases the GIL ------------------------------------------------


class Ticker:
    """Records the longest gap between ticks of a Python thread (it needs the GIL)."""

    def __init__(self):
        self.gap, self.stop = 0.0, threading.Event()
        self.t = threading.Thread(target=self.run)
        self.t.start()

    def run(self):
        last = time.monotonic()
        while not self.stop.wait(0.01):
            now = time.monotonic()
            self.gap, last = max(self.gap, now - last), now

    def finish(self):
        self.stop.set()
        self.t.join(5)
        return self.gap


@pytest.fixture
def silent_address():
    """A TCP port that accepts connections and never answers: RPCs hang to their deadline."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield f"127.0.0.1:{s.getsockname()[1]}"
    s.close()


@pytest.mark.parametrize("how", ["close", "del"])
def test_client_teardown_does_not_hold_the_gil(silent_address, how):
    cl = Client([silent_address], TOKEN, DIM, timeout_s=1.5)
    h = cl.push_async(np.arange(3, dtype=np.int64), np.ones((3, DIM), np.float32), 0.1)
    ticker = Ticker()
    t0 = time.monotonic()
    if how == "close":
        cl.close()
    else:
        del cl
    took = time.monotonic() - t0
    gap = ticker.finish()
    assert took > 0.5, "the in-flight push should have held teardown up"
    assert gap < 0.5, f"a Python thread stalled {gap:.2f} s: teardown held the GIL"
    with pytest.raises(PSError):
        h.wait(5)
    if how == "close":
        with pytest.raises(RuntimeError, match="client is closed"):
            cl.pull(np.arange(3, dtype=np.int64))
        cl.close()  # idempotent
