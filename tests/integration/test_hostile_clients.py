"""Hostile and broken clients against a real shard, through a real gRPC client built from
proto/ps.proto (grpcio; stubs generated into a temp dir at test time).

- every method refuses a missing or wrong token (call metadata) and changes nothing, and a
  call without the token is refused before its body is read: a huge body costs the shard no
  memory;
- a fuzz run sends random and mutated requests (field-level and byte-level) on every method:
  every request gets an answer, the shard stays up, and after every refused request the table
  is byte-identical to before it.  Size: $CPU_DIST_FUZZ_REQUESTS (default 1000, a few seconds);
- an oversized request is refused by the configured message limit, with memory unmoved;
- a connection's concurrent streams are bounded.
"""

from __future__ import annotations

import collections
import contextlib
import os
import time

import grpc
import numpy as np
import pytest

from cpu_dist.common.tokens import write_token_file
from cpu_dist.sparse import Client, Server
from cpu_dist.sparse.grpc_stubs import generate, token_metadata
from cpu_dist.testing.shards import standalone_shard

pytestmark = pytest.mark.timeout(300)
TOKEN = "fuzz-token-0123456789abcdef"
DIM = 4
LIMIT = 256 << 10
METHOD = "/cpu_dist.ps.ParameterServer/"
FUZZ_REQUESTS = int(os.environ.get("CPU_DIST_FUZZ_REQUESTS", "1000"))
METHODS = [
    "Pull",
    "Push",
    "Commit",
    "WaitCommitted",
    "CloseSession",
    "AbortSessions",
    "Stats",
    "Health",
    "Dump",
    "Shutdown",
    "Save",
    "Load",
    "CreateTables",
]


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("ps_proto_fuzz"))[0]


@pytest.fixture
def shard(tmp_path):
    srv = Server(
        DIM, TOKEN, init_scale=0.1, seed=3, max_message_bytes=LIMIT, checkpoint_dir=str(tmp_path)
    )
    srv.start()
    cl = Client([srv.address], TOKEN, DIM, timeout_s=20.0)
    keys = np.arange(50, dtype=np.int64)
    cl.push(keys, np.ones((50, DIM), np.float32), 0.1, "rowwise_adagrad")
    channel = grpc.insecure_channel(
        srv.address,
        options=[
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.max_receive_message_length", 64 << 20),
        ],
    )
    yield srv, cl, channel
    channel.close()
    srv.stop(2.0)


def snapshot(cl: Client) -> tuple:
    """The flag-declared table's rows, and every table's name, width and row count (a fuzzed
    CreateTables may add tables; a refused request must change none)."""
    k, v, s = cl.dump()
    tables = tuple((t["name"], t["dim"], t["rows"]) for t in cl.stats()[0]["tables"])
    return k.tobytes(), v.tobytes(), s.tobytes(), tables


def call(channel, method: str, payload: bytes, timeout: float = 10.0, token: str = TOKEN):
    """Raw bytes in (the token as call metadata), (status code, details) out."""
    fn = channel.unary_unary(METHOD + method)
    try:
        fn(payload, timeout=timeout, metadata=token_metadata(token))
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details()


def valid_request(pb, method: str, rng: np.random.Generator):
    n = int(rng.integers(0, 20))
    keys = rng.integers(-(2**40), 2**40, n).astype(np.int64).tobytes()
    grads = rng.standard_normal((n, DIM)).astype(np.float32).tobytes()
    # Half of the data requests in the one-table form (table, dim), half with parts (the
    # multi-table form, here naming the one table: fields mutated later may name others).
    table: dict = (
        {"table": b"embedding", "dim": DIM}
        if rng.integers(0, 2)
        else {"parts": [pb.TablePart(table=b"embedding", dim=DIM, count=n, lr=0.01)]}
    )
    if method == "Pull":
        return pb.PullRequest(**table, keys=keys)
    if method == "Push":
        return pb.PushRequest(
            **table, keys=keys, grads=grads, lr=0.01, optimizer=int(rng.integers(0, 2))
        )
    if method == "Commit":
        return pb.CommitRequest(
            **table,
            session=int(rng.integers(1, 4)),
            step=0,
            rank=0,
            world_size=int(rng.integers(1, 3)),
            chunk_index=0,
            chunk_count=1,
            lr=0.01,
            keys=keys,
            grads=grads,
        )
    if method == "CreateTables":
        spec = pb.TableSpec(
            name=pick(rng, [b"embedding", b"fuzz", b"fuzz"]),
            dim=int(pick(rng, [DIM, 8])),
            optimizer=int(rng.integers(0, 3)),
            init_scale=0.1,
            seed=3,
        )
        return pb.CreateTablesRequest(tables=[spec])
    if method == "WaitCommitted":
        return pb.WaitCommittedRequest(
            session=int(rng.integers(1, 4)), step=pick(rng, [-1, -1, -1, 0, 1])
        )
    if method == "CloseSession":
        return pb.CloseSessionRequest(session=int(rng.integers(1, 4)), rank=int(rng.integers(0, 3)))
    if method == "Dump":
        return pb.DumpRequest(
            table=b"embedding", partition=int(rng.integers(0, 4096)), max_bytes=4096
        )
    if method == "Save":
        return pb.SaveRequest(
            table=b"embedding",
            path=pick(rng, [b"f/a.bin", b"b.bin"]),
            step=int(rng.integers(0, 5)),
        )
    if method == "Load":
        return pb.LoadRequest(
            table=b"embedding",
            paths=[pick(rng, [b"f/a.bin", b"b.bin", b"none.bin"])],
            stage=int(rng.integers(0, 4)),
        )
    return getattr(pb, f"{method}Request")()


def pick(rng: np.random.Generator, options: list):
    return options[int(rng.integers(0, len(options)))]


def random_value(field, rng: np.random.Generator):
    t = field.type
    if field.name in ("table", "name"):  # a request's table, a TableSpec's name
        return pick(rng, [b"embedding", b"embedding", b"other", b"fuzz", b"\xff\xfe\x00", b""])
    if field.name == "path":
        return random_value_scalar(field, rng)
    if t == field.TYPE_BYTES:
        choice = int(rng.integers(0, 4))
        if choice == 0:
            return b""
        if choice == 1:
            return rng.bytes(int(rng.integers(1, 64)))
        n = int(rng.integers(0, 30))
        return rng.bytes(8 * n + (0 if choice == 2 else int(rng.integers(1, 8))))
    if t in (field.TYPE_UINT32,):
        return int(pick(rng, [0, 1, 2, 3, DIM, DIM + 1, 2**31, 2**32 - 1]))
    if t in (field.TYPE_UINT64,):
        return int(pick(rng, [0, 1, 2, 2**63, 2**64 - 1]))
    if t in (field.TYPE_INT64,):
        return int(pick(rng, [-(2**63), -1, 0, 1, 2, 5, 2**63 - 1]))
    if t == field.TYPE_FLOAT:
        return float(pick(rng, [float("nan"), float("inf"), -float("inf"), 0.0, 0.01, 1e30]))
    if t == field.TYPE_ENUM:
        return int(pick(rng, [0, 1, 2, 7, 2**31 - 1]))
    if t == field.TYPE_BOOL:
        return bool(rng.integers(0, 2))
    if field.is_repeated:
        raise AssertionError("repeated fields are set in mutate_fields")
    raise AssertionError(f"unhandled field type {t}")


def random_value_scalar(field, rng: np.random.Generator):
    if field.type == field.TYPE_BYTES:  # Load's paths
        return pick(rng, [b"f/a.bin", b"../x", b"/etc/passwd", b"", b"a//b", b"none.bin", b"\xff"])
    return int(pick(rng, [0, 1, 7, 2**32 - 1]))


def mutate_fields(msg, rng: np.random.Generator):
    fields = msg.DESCRIPTOR.fields
    if not fields:  # Stats, Health, Shutdown, AbortSessions: only the bytes can be mutated
        return mutate_bytes(msg.SerializeToString(), rng)
    for _ in range(int(rng.integers(1, 4))):
        f = fields[int(rng.integers(0, len(fields)))]
        if f.message_type is not None:  # parts, CreateTables' specs: random sub-messages
            del getattr(msg, f.name)[:]
            for _ in range(int(rng.integers(0, 3))):
                sub = getattr(msg, f.name).add()
                for sf in sub.DESCRIPTOR.fields:
                    if rng.integers(0, 2):
                        setattr(sub, sf.name, random_value(sf, rng))
        elif f.is_repeated:  # Load's paths, sizes, checksums
            del getattr(msg, f.name)[:]
            getattr(msg, f.name).extend(
                [random_value_scalar(f, rng) for _ in range(int(rng.integers(0, 3)))]
            )
        else:
            setattr(msg, f.name, random_value(f, rng))
    return msg.SerializeToString()


def mutate_bytes(data: bytes, rng: np.random.Generator) -> bytes:
    b = bytearray(data)
    kind = int(rng.integers(0, 6))
    if kind == 0 and b:  # flip bits
        for _ in range(int(rng.integers(1, 8))):
            i = int(rng.integers(0, len(b)))
            b[i] ^= 1 << int(rng.integers(0, 8))
    elif kind == 1 and b:  # truncate
        del b[int(rng.integers(0, len(b))) :]
    elif kind == 2:  # insert junk
        i = int(rng.integers(0, len(b) + 1))
        b[i:i] = rng.bytes(int(rng.integers(1, 16)))
    elif kind == 3:  # pure noise
        b = bytearray(rng.bytes(int(rng.integers(0, 256))))
    elif kind == 4:  # a field whose length runs past the end
        b += bytes([0x22, 0xFF, 0xFF, 0xFF, 0x7F]) + rng.bytes(4)
    else:  # an unknown field (tag 99) appended: valid proto
        b += bytes([0x9A, 0x06, 0x03]) + b"abc"
    return bytes(b)


def test_wrong_or_missing_token_is_refused_everywhere(shard, pb):
    _srv, cl, channel = shard
    before = snapshot(cl)
    rng = np.random.default_rng(0)
    for method in METHODS:
        for token, want in (
            ("", "missing token"),
            ("wrong", "wrong token"),
            (TOKEN[:-1], "wrong token"),
            (TOKEN + "x", "wrong token"),
        ):
            req = valid_request(pb, method, rng)
            code, details = call(channel, method, req.SerializeToString(), token=token)
            assert code == grpc.StatusCode.UNAUTHENTICATED, (method, token, code, details)
            assert want in details
    assert snapshot(cl) == before
    assert cl.health()[0]["serving"]


def test_fuzz_every_method(shard, pb):
    _srv, cl, channel = shard
    rng = np.random.default_rng(int(os.environ.get("CPU_DIST_FUZZ_SEED", "1")))
    outcomes: dict[str, collections.Counter] = {m: collections.Counter() for m in METHODS}
    before = snapshot(cl)
    t0 = time.monotonic()
    for i in range(FUZZ_REQUESTS):
        method = METHODS[i % len(METHODS)]
        # Shutdown only ever goes out with a bad token: a valid one would (rightly) stop it.
        token = TOKEN if method != "Shutdown" else "not-the-token-" + "z" * 12
        req = valid_request(pb, method, rng)
        mode = int(rng.integers(0, 3))
        if mode == 0:
            payload = mutate_fields(req, rng)
        elif mode == 1:
            payload = mutate_bytes(req.SerializeToString(), rng)
        else:
            payload = req.SerializeToString()
        timeout = 0.2 if method == "WaitCommitted" else 10.0
        code, details = call(channel, method, payload, timeout, token=token)
        outcomes[method][code.name] += 1
        # A long poll is answered shortly before the caller's deadline; on a loaded machine the
        # caller's 0.2 s may run out first, which is still an answer (and changes nothing).
        late_poll = method == "WaitCommitted" and code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert late_poll or code not in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.UNKNOWN,
            grpc.StatusCode.INTERNAL,
        ), (i, method, mode, code, details)
        after = snapshot(cl)
        if code != grpc.StatusCode.OK:
            assert after == before, f"request {i} ({method}, {code.name}: {details}) changed rows"
        before = after
    took = time.monotonic() - t0
    total = collections.Counter()
    for c in outcomes.values():
        total.update(c)
    print(f"FIGURE fuzz: {FUZZ_REQUESTS} requests in {took:.1f} s: {dict(total)}")
    for m, c in outcomes.items():
        print(f"FIGURE fuzz {m}: {dict(c)}")
    assert cl.health()[0]["serving"]
    assert total["OK"] > 0 and sum(total.values()) - total["OK"] > FUZZ_REQUESTS // 4


def resident_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_oversized_request_refused_by_the_configured_limit(shard, pb):
    _srv, cl, channel = shard
    before = snapshot(cl)
    rss0 = resident_bytes(os.getpid())
    n = 2 * LIMIT // (8 + 4 * DIM)
    for method in ("Push", "Pull", "Commit"):
        big = bytes(8 * n)
        payload = {
            "Push": lambda: pb.PushRequest(
                table=b"embedding", dim=DIM, keys=big, grads=bytes(4 * DIM * n), lr=0.1
            ),
            "Pull": lambda: pb.PullRequest(table=b"embedding", dim=DIM, keys=big * 4),
            "Commit": lambda: pb.CommitRequest(
                table=b"embedding",
                session=9,
                world_size=1,
                chunk_count=1,
                dim=DIM,
                lr=0.1,
                keys=big,
                grads=bytes(4 * DIM * n),
            ),
        }[method]()
        code, details = call(channel, method, payload.SerializeToString())
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (method, code, details)
    # A header that claims a 2 GiB field: refused by parsing, nothing is allocated for it.
    code, details = call(channel, "Push", bytes([0x22, 0xFF, 0xFF, 0xFF, 0xFF, 0x07]) + b"x" * 8)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert snapshot(cl) == before
    assert cl.stats()[0]["bytes_in"] < 4 * LIMIT  # the big bodies were never taken in
    assert resident_bytes(os.getpid()) - rss0 < 64 << 20
    assert cl.health()[0]["serving"]


def test_fields_that_size_allocations_are_capped(shard, pb):
    """world_size, chunk_count and rank size the shard's per-session bookkeeping: huge values
    are refused, not allocated (the fuzz run above once found one that ended the process)."""
    _srv, cl, channel = shard
    before = snapshot(cl)
    rss0 = resident_bytes(os.getpid())
    for ws, cc in [(2**32 - 1, 1), (2**31, 1), (1, 2**32 - 1), (1, 2**31), (10**8, 1)]:
        req = pb.CommitRequest(
            table=b"embedding",
            session=77,
            step=0,
            rank=0,
            world_size=ws,
            chunk_index=0,
            chunk_count=cc,
            dim=DIM,
            lr=0.1,
        )
        code, details = call(channel, "Commit", req.SerializeToString())
        assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED), (
            ws,
            cc,
            code,
            details,
        )
    assert snapshot(cl) == before
    assert resident_bytes(os.getpid()) - rss0 < 64 << 20
    assert cl.health()[0]["serving"]


def peak_resident_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@contextlib.contextmanager
def shard_process(tmp_path, max_message_mb: int):
    """A shard in a process of its own (its memory is its own), and its pid and address."""
    tf = tmp_path / "token"
    write_token_file(str(tf), TOKEN)
    extra = ["--max-message-mb", str(max_message_mb)]
    with standalone_shard(str(tf), DIM, extra=extra) as (address, p):
        yield p.pid, address


# Pull, Push and Commit are raw unary methods, whose request gRPC would receive whole with the
# call, were the token not checked before (token_gate.h).
@pytest.mark.parametrize("method", ["Push", "Pull", "Commit"])
def test_a_huge_body_without_the_token_is_refused_before_it_is_read(tmp_path, pb, method):
    body = 256 << 20
    with shard_process(tmp_path, max_message_mb=320) as (pid, address):
        cl = Client([address], TOKEN, DIM, timeout_s=20.0)
        cl.health()
        peak0 = peak_resident_bytes(pid)
        n = body // (8 + 4 * DIM)
        rows = dict(table=b"embedding", dim=DIM, keys=bytes(8 * n))
        if method == "Pull":
            req = pb.PullRequest(table=b"embedding", dim=DIM, keys=bytes(body))
        elif method == "Push":
            req = pb.PushRequest(**rows, grads=bytes(4 * DIM * n), lr=0.1)
        else:
            req = pb.CommitRequest(
                **rows, grads=bytes(4 * DIM * n), lr=0.1, session=1, world_size=1, chunk_count=1
            )
        opts = [("grpc.max_send_message_length", 512 << 20)]
        with grpc.insecure_channel(address, options=opts) as channel:
            for token in ("", "wrong"):  # no token, then a wrong one
                code, details = call(
                    channel, method, req.SerializeToString(), timeout=60.0, token=token
                )
                assert code == grpc.StatusCode.UNAUTHENTICATED, (code, details)
        grew = peak_resident_bytes(pid) - peak0
        stats = cl.stats()[0]
        mib = (body >> 20, grew >> 20)
        print(f"FIGURE {method}: {mib[0]} MiB body without a token: shard peak grew {mib[1]} MiB")
        assert grew < 32 << 20, grew  # not the body, not a parsed copy of it
        assert stats["bytes_in"] < 1 << 20 and stats["rows"] == 0 and stats["errors"] == 2


def test_concurrent_streams_of_a_connection_are_bounded(pb):
    srv = Server(DIM, TOKEN, init_scale=0.1, max_concurrent_streams=4)
    srv.start()
    try:
        with grpc.insecure_channel(srv.address) as channel:
            wait = channel.unary_unary(METHOD + "WaitCommitted")
            req = pb.WaitCommittedRequest(session=1, step=0).SerializeToString()
            md = token_metadata(TOKEN)
            polls = [wait.future(req, timeout=30, metadata=md) for _ in range(7)]
            deadline = time.monotonic() + 20
            while srv.stats()["waiters"] < 4:
                assert time.monotonic() < deadline
                time.sleep(0.01)  # a poll interval
            parked = [srv.stats()["waiters"] for _ in range(20)]
            assert max(parked) == 4, parked  # the other 3 wait in the client for a stream
            cl = Client([srv.address], TOKEN, DIM, timeout_s=20.0)
            cl.commit(1, 0, 0, 1, np.arange(3, dtype=np.int64), np.ones((3, DIM), np.float32), 0.1)
            for f in polls:
                f.result(timeout=30)  # every poll answered once the step committed
    finally:
        srv.stop(2.0)
