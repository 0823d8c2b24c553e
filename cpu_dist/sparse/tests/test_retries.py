"""Retries of idempotent calls: pulls and commit chunks that meet a reset connection are sent
again (at most 3 times, with back-off, within the call's timeout) and counted in traffic();
pushes are not; a shard that is gone for good still fails the call within its timeout.  The
transient failures come from a real TCP proxy that resets connections."""

import socket
import struct
import threading
import time

import numpy as np
import pytest

from cpu_dist.sparse import Client, PSError

from .conftest import TOKEN

pytestmark = pytest.mark.timeout(60)
DIM = 4


class ResettingProxy:
    """Forwards local connections to `target`, except that the next `resets` connections are
    reset (TCP RST) as soon as they are accepted; reset_all() also resets the open ones;
    close() stops listening, so that later connections are refused."""

    def __init__(self, target: str, resets: int):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.resets = resets
        self.lock = threading.Lock()
        self.open: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    @staticmethod
    def _rst(s: socket.socket) -> None:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        except OSError:
            pass

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            with self.lock:
                reset = self.resets > 0
                self.resets -= reset
            if reset:
                self._rst(conn)
                continue
            up = socket.create_connection(self.target)
            with self.lock:
                self.open += [conn, up]
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def reset_all(self, then: int) -> None:
        """Resets every open connection, and the next `then` ones."""
        with self.lock:
            conns, self.open = self.open, []
            self.resets = then
        for s in conns:
            self._rst(s)

    def close(self) -> None:
        try:  # wakes the accepting thread and stops listening (close alone does neither)
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self.reset_all(0)


@pytest.fixture
def shard(cluster_factory):
    c = cluster_factory(num_shards=1, dim=DIM)
    keys = np.arange(100, dtype=np.int64)
    c.client().push(keys, np.ones((100, DIM), np.float32), 0.5)
    return c, keys


def test_pull_and_commit_survive_reset_connections(shard):
    c, keys = shard
    want = c.client().pull(keys)
    proxy = ResettingProxy(c.addresses[0], resets=1)
    try:
        cl = Client([proxy.address], TOKEN, DIM, timeout_s=10.0, channels_per_shard=1)
        assert np.array_equal(cl.pull(keys), want)
        first = cl.traffic()["retries"]
        assert 1 <= first <= 3
        proxy.reset_all(then=1)  # the connection dies, and so does the next one
        g = np.ones((100, DIM), np.float32)
        cl.commit(21, 0, 0, 1, keys, g, 0.1)
        assert c.client().committed_step(21) == 0  # applied once
        assert cl.traffic()["retries"] > first
        assert cl.traffic()["keys_pushed"] == 100  # a retried chunk counts once
    finally:
        proxy.close()


def test_push_is_not_retried(shard):
    c, keys = shard
    proxy = ResettingProxy(c.addresses[0], resets=1)
    try:
        cl = Client([proxy.address], TOKEN, DIM, timeout_s=10.0, channels_per_shard=1)
        with pytest.raises(PSError, match="UNAVAILABLE"):
            cl.push(keys, np.ones((100, DIM), np.float32), 0.1)
        assert cl.traffic()["retries"] == 0
    finally:
        proxy.close()


@pytest.mark.parametrize("timeout_s", [0.12, 5.0])
def test_a_shard_gone_for_good_fails_the_call_within_its_timeout(shard, timeout_s):
    c, keys = shard
    proxy = ResettingProxy(c.addresses[0], resets=0)
    cl = Client([proxy.address], TOKEN, DIM, timeout_s=timeout_s, channels_per_shard=1)
    if timeout_s > 1:
        cl.pull(keys)  # connected first, then gone
    proxy.close()
    t0 = time.monotonic()
    with pytest.raises(PSError, match=r"UNAVAILABLE|DEADLINE_EXCEEDED"):
        cl.pull(keys)
    took = time.monotonic() - t0
    assert took < timeout_s + 0.5, took
    assert cl.traffic()["retries"] <= 3
