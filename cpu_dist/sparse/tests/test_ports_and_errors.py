"""One port serves one shard (a second bind is refused by name), and PSError's fields."""

from __future__ import annotations

import pickle
import socket

import numpy as np
import pytest

from cpu_dist.sparse import Client, PSError, Server

from .conftest import TOKEN

pytestmark = pytest.mark.timeout(60)


def test_a_second_shard_on_a_busy_port_is_refused(cluster_factory):
    first = cluster_factory(1, 4).servers[0]
    second = Server(4, TOKEN, init_scale=0.1, port=first.port)
    with pytest.raises(RuntimeError, match=rf"127\.0\.0\.1:{first.port}: address already in use"):
        second.start()
    # The first shard still answers alone: its rows, not a second table's.
    cl = Client([first.address], TOKEN, 4, timeout_s=10.0)
    cl.push(np.array([1], np.int64), np.ones((1, 4), np.float32), 1.0, "sgd")
    assert first.stats()["rows"] == 1


def test_a_port_another_process_listens_on_is_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(RuntimeError, match="address already in use"):
            Server(4, TOKEN, init_scale=0.1, port=port).start()


def test_ps_error_names_shard_address_and_code(cluster_factory):
    cluster = cluster_factory(2, 4)
    cl = Client(cluster.addresses, "wrong-token", 4, timeout_s=10.0)
    with pytest.raises(PSError) as info:
        cl.pull(np.array([0], np.int64))
    e = info.value
    assert isinstance(e, RuntimeError)
    assert e.code == "UNAUTHENTICATED"
    assert e.shard in (0, 1) and e.address == cluster.addresses[e.shard]
    assert str(e).startswith(f"shard {e.shard} ({e.address}): UNAUTHENTICATED: ")
    # Asynchronous operations carry the same fields.
    h = cl.pull_async(np.array([0, 1, 2, 3], np.int64))
    with pytest.raises(PSError) as info:
        h.wait(10)
    assert info.value.code == "UNAUTHENTICATED" and info.value.shard is not None
    again = pickle.loads(pickle.dumps(info.value))
    assert (again.shard, again.address, again.code, str(again)) == (
        info.value.shard,
        info.value.address,
        info.value.code,
        str(info.value),
    )


def test_ps_error_is_constructible_with_a_message_alone():
    e = PSError("renamed: shard 0 is rank 3")
    assert str(e) == "renamed: shard 0 is rank 3"
    assert (e.shard, e.address, e.code) == (None, None, None)
    with pytest.raises(RuntimeError):
        raise e
