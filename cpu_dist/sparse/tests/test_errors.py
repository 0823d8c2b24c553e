"""Malformed and unauthorised requests get a precise status, the shard keeps serving and no
row changes.  Requests are built with grpcio stubs from proto/ps.proto, bypassing our client."""

import grpc
import numpy as np
import pytest

from cpu_dist.sparse import PSError

from .conftest import TOKEN

pytestmark = pytest.mark.timeout(60)
DIM = 4
METHOD = "/cpu_dist.ps.ParameterServer/"


@pytest.fixture
def env(cluster_factory, pb):
    c = cluster_factory(num_shards=1, dim=DIM, max_message_bytes=1 << 20)
    cl = c.client()
    keys = np.arange(5, dtype=np.int64)
    cl.push(keys, np.ones((5, DIM), np.float32), 0.1, "rowwise_adagrad")
    channel = grpc.insecure_channel(c.addresses[0])
    stub = pb[1].ParameterServerStub(channel)
    yield c, cl, stub, pb[0], channel
    channel.close()


def keys_bytes(keys):
    return np.asarray(keys, np.int64).tobytes()


def grads_bytes(n, dim=DIM):
    return np.ones((n, dim), np.float32).tobytes()


def expect(call, code, fragment):
    with pytest.raises(grpc.RpcError) as ei:
        call()
    assert ei.value.code() == code, ei.value.details()
    assert fragment in ei.value.details(), ei.value.details()


def snapshot(cl):
    k, v, s = cl.dump()
    return k.copy(), v.copy(), s.copy()


def same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def _pull_push_cases(pb, P, PU, pull, push, IA, NF, UA):
    return [
        ("Pull", P(**{**pull, "token": ""}), UA, "missing token"),
        ("Pull", P(**{**pull, "token": "nope"}), UA, "wrong token"),
        ("Pull", P(**{**pull, "token": TOKEN + "x"}), UA, "wrong token"),
        ("Pull", P(**{**pull, "table": "other"}), NF, "unknown table 'other'"),
        ("Pull", P(**{**pull, "dim": 5}), IA, "dim 5 does not match the table's dim 4"),
        ("Pull", P(**{**pull, "keys": b"\x00" * 13}), IA, "keys has 13 bytes, not a multiple of 8"),
        ("Push", PU(**{**push, "token": "nope"}), UA, "wrong token"),
        ("Push", PU(**{**push, "table": "t2"}), NF, "unknown table 't2'"),
        ("Push", PU(**{**push, "dim": 8}), IA, "dim 8 does not match"),
        ("Push", PU(**{**push, "keys": b"\x01" * 31}), IA, "keys has 31 bytes"),
        (
            "Push",
            PU(**{**push, "grads": grads_bytes(4)[:-4]}),
            IA,
            "grads has 60 bytes, expected 64 (4 keys x dim 4 x 4)",
        ),
        ("Push", PU(**{**push, "lr": float("nan")}), IA, "lr is not finite"),
        ("Push", PU(**{**push, "lr": float("inf")}), IA, "lr is not finite"),
        ("Push", PU(**{**push, "optimizer": 7}), IA, "unknown optimizer 7"),
    ]


def cases(pb):
    ok_keys = keys_bytes([1, 2, 3, 100])
    push = dict(token=TOKEN, table="embedding", dim=DIM, keys=ok_keys, grads=grads_bytes(4), lr=0.1)
    commit = dict(
        token=TOKEN,
        table="embedding",
        session=1,
        step=0,
        rank=0,
        world_size=1,
        chunk_index=0,
        chunk_count=1,
        dim=DIM,
        lr=0.1,
        keys=ok_keys,
        grads=grads_bytes(4),
    )
    IA, NF, UA = (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.UNAUTHENTICATED,
    )
    P, PU, C = pb.PullRequest, pb.PushRequest, pb.CommitRequest
    pull = dict(token=TOKEN, table="embedding", dim=DIM, keys=ok_keys)
    commit_and_admin = [
        ("Commit", C(**{**commit, "token": ""}), UA, "missing token"),
        ("Commit", C(**{**commit, "dim": 3}), IA, "dim 3 does not match"),
        ("Commit", C(**{**commit, "grads": b""}), IA, "grads has 0 bytes, expected 64"),
        ("Commit", C(**{**commit, "rank": 1}), IA, "rank 1 out of range for world_size 1"),
        ("Commit", C(**{**commit, "chunk_index": 1}), IA, "chunk_index 1 out of range"),
        ("Commit", C(**{**commit, "chunk_count": 0}), IA, "chunk_count must be >= 1"),
        ("Commit", C(**{**commit, "world_size": 0, "rank": 0}), IA, "world_size must be >= 1"),
        (
            "Commit",
            C(**{**commit, "step": 3}),
            grpc.StatusCode.FAILED_PRECONDITION,
            "out-of-order step 3",
        ),
        ("Stats", pb.StatsRequest(token="bad"), UA, "wrong token"),
        ("Health", pb.HealthRequest(), UA, "missing token"),
        ("Dump", pb.DumpRequest(token=TOKEN, table="x"), NF, "unknown table 'x'"),
        ("Shutdown", pb.ShutdownRequest(token="bad"), UA, "wrong token"),
        ("WaitCommitted", pb.WaitCommittedRequest(token="bad"), UA, "wrong token"),
        (
            "Commit",
            C(**{**commit, "world_size": (1 << 16) + 1}),
            IA,
            "world_size 65537 exceeds 65536",
        ),
        (
            "Commit",
            C(**{**commit, "world_size": 0xFFFFFFFF, "rank": 0xFFFFFFFE}),
            IA,
            "world_size 4294967295 exceeds 65536",
        ),
        (
            "Commit",
            C(**{**commit, "chunk_count": (1 << 20) + 1}),
            IA,
            "chunk_count 1048577 exceeds 1048576",
        ),
        (
            "Commit",
            C(**{**commit, "chunk_count": 0xFFFFFFFF, "chunk_index": 0xFFFFFFFE}),
            IA,
            "chunk_count 4294967295 exceeds 1048576",
        ),
        ("CloseSession", pb.CloseSessionRequest(token="bad", session=99), UA, "wrong token"),
    ]
    return _pull_push_cases(pb, P, PU, pull, push, IA, NF, UA) + commit_and_admin


def test_every_bad_request_is_refused_and_changes_nothing(env):
    _c, cl, stub, pb, _ = env
    before = snapshot(cl)
    errors_before = cl.stats()[0]["errors"]
    all_cases = cases(pb)
    for method, req, code, fragment in all_cases:
        expect(lambda: getattr(stub, method)(req, timeout=10), code, fragment)
        assert same(snapshot(cl), before), method
    assert cl.stats()[0]["errors"] == errors_before + len(all_cases)
    assert cl.health()[0]["serving"]
    assert cl.committed_step(1) == -1


@pytest.mark.parametrize("method", ["Pull", "Push", "Commit", "Stats", "Dump"])
def test_garbage_bytes(env, method):
    _c, cl, _, _, channel = env
    before = snapshot(cl)
    call = channel.unary_unary(METHOD + method)  # raw bytes in, raw bytes out
    expect(
        lambda: call(b"\xff\xff\xff\xff", timeout=10),
        grpc.StatusCode.INVALID_ARGUMENT,
        "bytes do not parse",
    )
    assert same(snapshot(cl), before)


def test_oversized_request_refused_by_grpc(env):
    _c, cl, stub, pb, _ = env
    before = snapshot(cl)
    n = 70000  # 70000 keys x (8 + 16) bytes > 1 MiB limit of this server
    req = pb.PushRequest(
        token=TOKEN,
        table="embedding",
        dim=DIM,
        keys=keys_bytes(np.arange(n)),
        grads=grads_bytes(n),
        lr=0.1,
    )
    expect(lambda: stub.Push(req, timeout=10), grpc.StatusCode.RESOURCE_EXHAUSTED, "")
    assert same(snapshot(cl), before)


def test_our_client_error_names_shard_address_and_code(cluster_factory):
    c = cluster_factory(num_shards=2, dim=DIM)
    bad = c.client(table="nope")
    with pytest.raises(PSError) as ei:
        bad.pull(np.arange(50, dtype=np.int64))
    msg = str(ei.value)
    assert isinstance(ei.value, RuntimeError)
    assert "NOT_FOUND: unknown table 'nope'" in msg
    assert msg.startswith((f"shard 0 ({c.addresses[0]}): ", f"shard 1 ({c.addresses[1]}): "))
    from cpu_dist.sparse import Client

    wrong = Client(c.addresses, "wrong", DIM, timeout_s=10)
    with pytest.raises(PSError, match="UNAUTHENTICATED: wrong token"):
        wrong.push(np.arange(4, dtype=np.int64), np.ones((4, DIM), np.float32), 0.1)
    with pytest.raises(PSError, match="UNAUTHENTICATED"):
        wrong.push_async(np.arange(4, dtype=np.int64), np.ones((4, DIM), np.float32), 0.1).wait(10)
    assert c.rows() == 0


def test_unreachable_shard_is_a_psError():
    from cpu_dist.sparse import Client

    cl = Client(["127.0.0.1:1"], "t", 4, timeout_s=2.0)
    with pytest.raises(PSError, match=r"shard 0 \(127.0.0.1:1\): (UNAVAILABLE|DEADLINE_EXCEEDED)"):
        cl.pull(np.arange(3, dtype=np.int64))
