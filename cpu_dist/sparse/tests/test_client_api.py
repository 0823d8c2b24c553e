"""The client's Python surface: pull_async and its Handle, traffic() counters, and the
keyword defaults' one definition (client_defaults())."""

import ast
import gc
import math
import re
import socket
import threading
from pathlib import Path

import numpy as np
import pytest

import cpu_dist.sparse
from cpu_dist.sparse import Client, PSError, Server, client_defaults

from .conftest import TOKEN, rng_grads

pytestmark = pytest.mark.timeout(60)
DIM = 4
PER_KEY = 8 + 4 * DIM  # one int64 key and one float32 row of DIM


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.fixture
def silent_address():
    """A TCP port that accepts connections and never answers: RPCs hang to their deadline."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield f"127.0.0.1:{s.getsockname()[1]}"
    s.close()


# ---- pull_async ------------------------------------------------------------------------------


@pytest.mark.parametrize("max_keys", [7, 8192])
def test_pull_async_equals_pull(cluster_factory, max_keys):
    c = cluster_factory(num_shards=3, dim=DIM)
    cl = c.client(max_keys_per_rpc=max_keys)
    rng = np.random.default_rng(3)
    written = rng.integers(-500, 500, 200).astype(np.int64)
    cl.push(written, rng_grads(rng, 200, DIM), 0.1)
    keys = np.concatenate([rng.integers(-600, 600, 3000), [5, 5, -5, 5]]).astype(np.int64)
    h = cl.pull_async(keys)
    rows = h.wait(20)
    assert rows.dtype == np.float32 and rows.shape == (len(keys), DIM)
    assert rows.flags.c_contiguous and rows.flags.writeable
    assert np.array_equal(bits(rows), bits(cl.pull(keys)))
    assert h.done() and h.wait(0) is rows  # later waits return the same array
    empty = cl.pull_async(np.zeros(0, np.int64)).wait(5)
    assert empty.shape == (0, DIM) and empty.dtype == np.float32


def test_pull_async_reads_keys_only_before_it_returns(cluster_factory):
    c = cluster_factory(num_shards=2, dim=DIM)
    cl = c.client(max_keys_per_rpc=16)
    keys = np.arange(1000, dtype=np.int64)
    expect = cl.pull(keys)
    h = cl.pull_async(keys)
    keys[:] = -1  # the caller's array is theirs again at once
    del keys
    gc.collect()
    assert np.array_equal(bits(h.wait(20)), bits(expect))


def test_dropping_pull_handles_before_wait_is_safe(cluster_factory):
    c = cluster_factory(num_shards=2, dim=DIM)
    cl = c.client(max_keys_per_rpc=64)
    keys = np.arange(5000, dtype=np.int64)
    for _ in range(20):  # dropped at once: the replies land in rows the op owns
        cl.pull_async(keys)
    gc.collect()
    assert np.array_equal(bits(cl.pull(keys[:10])), bits(cl.pull_async(keys[:10]).wait(20)))
    cl.close()  # waits for the dropped ones


def test_dropped_pull_handle_on_a_silent_shard(silent_address):
    cl = Client([silent_address], TOKEN, DIM, timeout_s=1.0)
    h = cl.pull_async(np.arange(100, dtype=np.int64))
    with pytest.raises(TimeoutError):
        h.wait(0.05)
    del h
    gc.collect()
    failed = cl.pull_async(np.arange(3, dtype=np.int64))
    with pytest.raises(PSError, match="DEADLINE_EXCEEDED"):
        failed.wait(20)
    cl.close()  # the dropped op ended by its deadline; nothing left to write into


# ---- traffic ---------------------------------------------------------------------------------


@pytest.mark.parametrize("max_keys", [1, 8192])
def test_traffic_counts_payload_bytes_exactly(cluster_factory, max_keys):
    c = cluster_factory(num_shards=2, dim=DIM)
    cl = c.client(max_keys_per_rpc=max_keys)
    zero = dict(bytes_pulled=0, bytes_pushed=0, keys_pulled=0, keys_pushed=0, retries=0)
    assert cl.traffic() == zero
    cl.pull(np.array([1, 2, 2, 3, 1], np.int64))  # 3 distinct keys cross the wire
    assert cl.traffic() == dict(zero, bytes_pulled=3 * PER_KEY, keys_pulled=3)
    g = np.ones((3, DIM), np.float32)
    cl.push(np.array([5, 5, 6], np.int64), g, 0.1)  # merged into 2 rows before sending
    cl.commit(1, 0, 0, 1, np.array([7, 7, 8], np.int64), g, 0.1)  # not merged: 3 rows
    cl.commit(1, 1, 0, 1, np.zeros(0, np.int64), g[:0], 0.1)  # empty markers: no payload
    cl.pull_async(np.array([9], np.int64)).wait(10)
    cl.push_async(np.array([10], np.int64), g[:1], 0.1).wait(10)
    assert cl.traffic() == dict(
        bytes_pulled=4 * PER_KEY, bytes_pushed=6 * PER_KEY, keys_pulled=4, keys_pushed=6, retries=0
    )
    cl.stats()
    cl.health()
    cl.dump()  # administration is not traffic
    assert cl.traffic()["bytes_pulled"] == 4 * PER_KEY


def test_traffic_counts_only_successful_calls_and_is_thread_safe(cluster_factory):
    c = cluster_factory(num_shards=2, dim=DIM)
    wrong = Client(c.addresses, "wrong", DIM, timeout_s=10)
    with pytest.raises(PSError, match="UNAUTHENTICATED"):
        wrong.pull(np.arange(10, dtype=np.int64))
    assert wrong.traffic()["bytes_pulled"] == 0 and wrong.traffic()["keys_pulled"] == 0
    cl = c.client(max_keys_per_rpc=3)
    keys = np.arange(10, dtype=np.int64)

    def work():
        for _ in range(20):
            cl.pull(keys)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert cl.traffic()["keys_pulled"] == 4 * 20 * 10
    assert cl.traffic()["bytes_pulled"] == 4 * 20 * 10 * PER_KEY


# ---- identity ---------------------------------------------------------------------------------


def test_health_names_the_shards_identity(cluster_factory):
    c = cluster_factory(num_shards=2, dim=DIM, init_scale=0.3, seed=11)
    cl = c.client()
    cl.push(np.arange(40, dtype=np.int64), np.ones((40, DIM), np.float32), 0.1)
    health = cl.health()
    assert [h["shard_index"] for h in health] == [0, 1]
    for h in health:
        assert h["num_shards"] == 2 and h["dim"] == DIM and h["table"] == "embedding"
        assert h["seed"] == 11
        assert h["init_scale"] == float(np.float32(0.3))  # the float32 the shard holds
        assert isinstance(h["rows"], int) and h["rows"] > 0
    assert sum(h["rows"] for h in health) == 40


# ---- defaults --------------------------------------------------------------------------------


def binding_defaults() -> dict[str, object]:
    """Client.__init__'s keyword defaults, from the signature pybind11 writes."""
    signature = Client.__init__.__doc__.splitlines()[0]
    return {
        name: ast.literal_eval(value)
        for name, value in re.findall(r"(\w+): [^,=]+ = ([^,)]+)", signature)
    }


def stub_defaults() -> dict[str, object]:
    """Client.__init__'s keyword defaults as _ps.pyi declares them."""
    tree = ast.parse((Path(cpu_dist.sparse.__file__).parent / "_ps.pyi").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Client"]
    (init,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    return {
        a.arg: eval(compile(ast.Expression(d), "_ps.pyi", "eval"), {})
        for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults)
    }


def test_client_defaults_are_the_keyword_defaults():
    d = client_defaults()
    assert set(d) == {
        "max_keys_per_rpc",
        "channels_per_shard",
        "timeout_s",
        "max_message_bytes",
        "compression",
    }
    for name, value in d.items():
        assert binding_defaults()[name] == value, name
        assert stub_defaults()[name] == value, name
    assert binding_defaults()["table"] == stub_defaults()["table"] == "embedding"


def test_constructed_with_defaults(cluster_factory):
    c = cluster_factory(num_shards=1, dim=DIM)
    cl = Client(c.addresses, TOKEN, DIM)
    assert cl.pull(np.arange(3, dtype=np.int64)).shape == (3, DIM)


# ---- checkpoint timeouts ---------------------------------------------------------------------


def test_checkpoint_timeout_none_is_the_clients_and_nan_is_refused(tmp_path):
    srv = Server(DIM, TOKEN, init_scale=0.1, checkpoint_dir=str(tmp_path))
    srv.start()
    try:
        cl = Client([srv.address], TOKEN, DIM, timeout_s=10.0)
        cl.push(np.arange(5, dtype=np.int64), np.ones((5, DIM), np.float32), 0.1)
        with pytest.raises(ValueError, match="NaN"):
            cl.save(["a.bin"], 0, timeout_s=math.nan)
        res = cl.save(["a.bin"], 0)  # None: the client's 10 s
        assert res[0]["rows"] == 5
        assert cl.load(["a.bin"], timeout_s=30.0)[0]["rows"] == 5
        with pytest.raises(PSError, match="DEADLINE_EXCEEDED"):
            cl.save(["b.bin"], 0, timeout_s=0.0)
    finally:
        srv.stop(2.0)
