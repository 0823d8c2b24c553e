"""Malformed and unauthorised requests get a precise status, the shard keeps serving and no
row changes.  Requests are built with grpcio stubs from proto/ps.proto, bypassing our client."""

import grpc
import numpy as np
import pytest

from cpu_dist.sparse import PSError
from cpu_dist.sparse.grpc_stubs import token_metadata

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


def bad_grads(n, row, value, dim=DIM):
    """n gradient rows of ones with ``value`` at (row, 1)."""
    g = np.ones((n, dim), np.float32)
    g[row, 1] = value
    return g.tobytes()


def two_bad_grads(n):
    """``n`` rows of ones with inf at row 30, column 1 and nan at row 35, column 3."""
    g = np.ones((n, DIM), np.float32)
    g[30, 1], g[35, 3] = np.inf, np.nan
    return g.tobytes()


def expect(call, code, fragment):
    """``call`` fails with ``code`` and a message holding ``fragment``."""
    with pytest.raises(grpc.RpcError) as ei:
        call()
    assert ei.value.code() == code, ei.value.details()
    assert fragment in ei.value.details(), ei.value.details()


def snapshot(cl):
    k, v, s = cl.dump()
    return k.copy(), v.copy(), s.copy()


def same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b))


# A case: (method, request, code, message fragment[, the token its call carries]).
def _pull_push_cases(pb, P, PU, pull, push, IA, NF, UA):
    return [
        ("Pull", P(**pull), UA, "missing token", ""),
        ("Pull", P(**pull), UA, "wrong token", "nope"),
        ("Pull", P(**pull), UA, "wrong token", TOKEN + "x"),
        ("Pull", P(**{**pull, "table": b"other"}), NF, "unknown table 'other'"),
        ("Pull", P(**{**pull, "table": b"\xff\xfe"}), NF, "unknown table '\\xff\\xfe'"),
        ("Pull", P(**{**pull, "dim": 5}), IA, "dim 5 does not match the table's dim 4"),
        ("Pull", P(**{**pull, "keys": b"\x00" * 13}), IA, "keys has 13 bytes, not a multiple of 8"),
        ("Push", PU(**push), UA, "wrong token", "nope"),
        ("Push", PU(**{**push, "table": b"t2"}), NF, "unknown table 't2'"),
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
        ("Push", PU(**{**push, "lr": 0.0}), IA, "lr must be > 0, got lr 0"),
        ("Push", PU(**{**push, "lr": -0.5}), IA, "lr must be > 0, got lr -0.5"),
        (
            "Push",
            PU(**{**push, "grads": bad_grads(4, row=2, value=np.nan)}),
            IA,
            "non-finite gradient in push: key 3 column 1 is nan",
        ),
        (  # the first of two, past the check's first block of 64 floats and not on a boundary
            "Push",
            PU(**{**push, "keys": keys_bytes(range(1000, 1040)), "grads": two_bad_grads(40)}),
            IA,
            "non-finite gradient in push: key 1030 column 1 is inf",
        ),
        ("Push", PU(**{**push, "optimizer": 7}), IA, "unknown optimizer 7"),
    ]


def cases(pb):
    ok_keys = keys_bytes([1, 2, 3, 100])
    push = dict(table=b"embedding", dim=DIM, keys=ok_keys, grads=grads_bytes(4), lr=0.1)
    commit = dict(
        table=b"embedding",
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
    pull = dict(table=b"embedding", dim=DIM, keys=ok_keys)
    commit_and_admin = [
        ("Commit", C(**commit), UA, "missing token", ""),
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
        ("Commit", C(**{**commit, "lr": 0.0}), IA, "lr must be > 0"),
        ("Commit", C(**{**commit, "lr": float("-inf")}), IA, "lr is not finite"),
        (
            "Commit",
            C(**{**commit, "rank": 1, "world_size": 2, "grads": bad_grads(4, 3, np.inf)}),
            IA,
            "non-finite gradient in session 1 step 0 rank 1: key 100 column 1 is inf",
        ),
        ("Commit", C(**{**commit, "max_ahead": 65}), IA, "max_ahead 65 exceeds 64"),
        ("Stats", pb.StatsRequest(), UA, "wrong token", "bad"),
        ("Health", pb.HealthRequest(), UA, "missing token", ""),
        ("Dump", pb.DumpRequest(table=b"x"), NF, "unknown table 'x'"),
        ("Dump", pb.DumpRequest(table=b"embedding", partition=4096), IA, "partition 4096 out of"),
        ("Shutdown", pb.ShutdownRequest(), UA, "wrong token", "bad"),
        ("WaitCommitted", pb.WaitCommittedRequest(), UA, "wrong token", "bad"),
        ("AbortSessions", pb.AbortSessionsRequest(), UA, "missing token", ""),
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
        ("CloseSession", pb.CloseSessionRequest(session=99), UA, "wrong token", "bad"),
    ]
    return _pull_push_cases(pb, P, PU, pull, push, IA, NF, UA) + commit_and_admin


def test_every_bad_request_is_refused_and_changes_nothing(env):
    _c, cl, stub, pb, _ = env
    before = snapshot(cl)
    errors_before = cl.stats()[0]["errors"]
    all_cases = cases(pb)
    for method, req, code, fragment, *token in all_cases:
        md = token_metadata(token[0] if token else TOKEN)
        expect(lambda: getattr(stub, method)(req, timeout=10, metadata=md), code, fragment)
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
        lambda: call(b"\xff\xff\xff\xff", timeout=10, metadata=token_metadata(TOKEN)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "bytes do not parse",
    )
    assert same(snapshot(cl), before)


@pytest.mark.parametrize("method", ["Push", "Commit"])
def test_truncated_large_request(env, method):
    """A request of many slices, cut inside its gradients, is refused whole: the shard parses
    gRPC's slices as they are, and a field that ends past the last one must not parse."""
    _c, cl, _, pb, channel = env
    before = snapshot(cl)
    n = 30000  # 30000 x (8 + 16) bytes: about 720 KB, under this server's 1 MiB limit
    fields = dict(table=b"embedding", dim=DIM, keys=keys_bytes(np.arange(n)), grads=grads_bytes(n))
    if method == "Push":
        req = pb.PushRequest(**fields, lr=0.1)
    else:
        req = pb.CommitRequest(**fields, lr=0.1, session=1, world_size=1, chunk_count=1)
    cut = req.SerializeToString()[:-1]
    call = channel.unary_unary(METHOD + method)
    expect(
        lambda: call(cut, timeout=10, metadata=token_metadata(TOKEN)),
        grpc.StatusCode.INVALID_ARGUMENT,
        f"{len(cut)} bytes do not parse",
    )
    assert same(snapshot(cl), before)


def test_oversized_request_refused_by_grpc(env):
    _c, cl, stub, pb, _ = env
    before = snapshot(cl)
    n = 70000  # 70000 keys x (8 + 16) bytes > 1 MiB limit of this server
    req = pb.PushRequest(
        table=b"embedding",
        dim=DIM,
        keys=keys_bytes(np.arange(n)),
        grads=grads_bytes(n),
        lr=0.1,
    )
    md = token_metadata(TOKEN)
    expect(lambda: stub.Push(req, timeout=10, metadata=md), grpc.StatusCode.RESOURCE_EXHAUSTED, "")
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


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_client_refuses_non_finite_gradients_and_bad_lr_before_sending(cluster_factory):
    c = cluster_factory(num_shards=2, dim=DIM)
    cl = c.client()
    k = np.array([5, 6, 7], dtype=np.int64)
    g64 = np.ones((3, DIM))
    g64[1, 2] = 1e39  # a float64 gradient beyond float32's range
    with pytest.raises(ValueError, match=r"key 6 in push \(row 1, column 2\) is not finite"):
        cl.push(k, g64, 0.1)
    g = np.ones((3, DIM), np.float32)
    g[2, 0] = np.nan
    msg = r"key 7 in commit of session 1 step 0 rank 0 \(row 2, column 0\) is not finite .*nan"
    with pytest.raises(ValueError, match=msg):
        cl.commit(1, 0, 0, 1, k, g, 0.1)
    many = np.arange(1000, 1040, dtype=np.int64)  # the first of two, past the first block
    with pytest.raises(ValueError, match=r"key 1030 in push \(row 30, column 1\) .* \(inf\)"):
        cl.push(many, np.frombuffer(two_bad_grads(40), np.float32).reshape(40, DIM), 0.1)
    with pytest.raises(ValueError, match="gradient of key 5"):
        cl.commit_async(1, 0, 0, 1, k, np.full((3, DIM), -np.inf, np.float32), 0.1)
    for lr in (0.0, -0.1, float("nan"), float("inf"), 1e39):
        with pytest.raises(ValueError, match="lr must be finite and > 0"):
            cl.push(k, np.ones((3, DIM), np.float32), lr)
    assert cl.traffic()["keys_pushed"] == 0 and c.rows() == 0


def test_a_non_finite_chunk_is_refused_and_its_step_never_applies(env):
    _c, cl, stub, pb, _ = env
    before = snapshot(cl)
    k = np.array([1, 2, 3, 100], dtype=np.int64)
    cl.commit(5, 0, 0, 2, k, np.ones((4, DIM), np.float32), 0.1)  # rank 0: fine, pending
    bad = pb.CommitRequest(
        table=b"embedding",
        session=5,
        step=0,
        rank=1,
        world_size=2,
        chunk_index=0,
        chunk_count=1,
        dim=DIM,
        lr=0.1,
        keys=k.tobytes(),
        grads=bad_grads(4, row=1, value=-np.inf),
    )
    expect(
        lambda: stub.Commit(bad, timeout=10, metadata=token_metadata(TOKEN)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "non-finite gradient in session 5 step 0 rank 1: key 2 column 1 is -inf",
    )
    assert cl.committed_step(5) == -1 and same(snapshot(cl), before)
