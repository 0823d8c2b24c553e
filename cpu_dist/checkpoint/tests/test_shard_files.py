"""Shard checkpoint files through the PS service (Save/Load RPCs) on real in-process shards:
round trip, re-partitioning into other shard counts, and every kind of bad file refused with
a message that names it, the table untouched."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_dist.common.tokens import write_token_file
from cpu_dist.sparse import Client, PSError, Server
from cpu_dist.testing.shards import standalone_shard, stop

pytestmark = pytest.mark.timeout(120)
TOKEN, DIM, SEED = "ckpt-token", 8, 5


class Shards:
    def __init__(self, n: int, root, dim: int = DIM, table: str = "embedding"):
        self.servers = [
            Server(
                dim,
                TOKEN,
                init_scale=0.1,
                seed=SEED,
                shard_index=i,
                num_shards=n,
                table=table,
                checkpoint_dir=str(root),
            )
            for i in range(n)
        ]
        for s in self.servers:
            s.start()
        self.client = Client(
            [s.address for s in self.servers], TOKEN, dim, table=table, timeout_s=30.0
        )

    def stop(self):
        for s in self.servers:
            s.stop(2.0)


@pytest.fixture
def shards(tmp_path):
    made = []

    def make(n, **kw):
        s = Shards(n, tmp_path, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def train_some(client: Client, rounds: int = 3, n: int = 3000) -> None:
    rng = np.random.default_rng(0)
    for _ in range(rounds):
        keys = rng.integers(-(10**12), 10**12, n).astype(np.int64)
        keys[: n // 3] = np.arange(n // 3)  # some keys again and again
        client.push(keys, rng.standard_normal((n, DIM)).astype(np.float32), 0.1, "rowwise_adagrad")


def dump(client: Client):
    k, v, s = client.dump()
    return k.copy(), v.copy(), s.copy()


def assert_same(a, b):
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def save(client: Client, name: str, step: int = 7):
    n = client.num_shards
    paths = [f"{name}/shard-{i}-of-{n}.bin" for i in range(n)]
    res = client.save(paths, step)
    return paths, [r["bytes"] for r in res], [r["checksum"] for r in res], res


@pytest.mark.parametrize("src,dst", [(1, 1), (1, 3), (3, 1), (2, 3)])
def test_round_trip_into_any_shard_count(shards, src, dst):
    a = shards(src)
    train_some(a.client)
    want = dump(a.client)
    paths, sizes, sums, res = save(a.client, f"p{src}")
    assert sum(r["rows"] for r in res) == len(want[0])
    b = shards(dst)
    loaded = b.client.load(paths, sizes, sums)
    assert sum(r["rows"] for r in loaded) == len(want[0])
    assert all(r["step"] == 7 for r in loaded)
    assert_same(dump(b.client), want)
    # Each shard holds exactly the keys it owns: pulls agree with the source.
    keys = want[0][::7]
    np.testing.assert_array_equal(b.client.pull(keys), a.client.pull(keys))
    # ... and training continues identically on both.
    train_some(a.client, rounds=1)
    train_some(b.client, rounds=1)
    assert_same(dump(b.client), dump(a.client))


def test_same_table_same_bytes(shards, tmp_path):
    a = shards(2)
    train_some(a.client)
    p1, *_ = save(a.client, "x")
    p2, *_ = save(a.client, "y")
    for f1, f2 in zip(p1, p2):
        assert (tmp_path / f1).read_bytes() == (tmp_path / f2).read_bytes()
    assert not list(tmp_path.rglob("*.tmp-*"))  # temporaries renamed away


def refused(client, paths, sizes, sums, fragment, before):
    with pytest.raises(PSError) as ei:
        client.load(paths, sizes, sums)
    assert fragment in str(ei.value), str(ei.value)
    assert_same(dump(client), before)  # nothing loaded, not even partly
    return str(ei.value)


def test_bad_files_are_refused_and_named(shards, tmp_path):
    a = shards(2)
    train_some(a.client)
    paths, sizes, sums, _ = save(a.client, "good")
    b = shards(2)
    b.client.push(np.arange(5, dtype=np.int64), np.ones((5, DIM), np.float32), 0.1)
    before = dump(b.client)
    f0 = tmp_path / paths[0]
    good = f0.read_bytes()

    # missing
    f0.rename(tmp_path / "moved")
    msg = refused(b.client, paths, sizes, sums, "missing", before)
    assert paths[0] in msg
    (tmp_path / "moved").rename(f0)
    # truncated
    f0.write_bytes(good[:-100])
    msg = refused(b.client, paths, sizes, sums, "truncated", before)
    assert paths[0] in msg
    refused(b.client, paths, [], [], "truncated", before)  # without manifest sizes too
    # one flipped byte in the last partition block (read by whichever shard owns it)
    bad = bytearray(good)
    bad[-3] ^= 0x40
    f0.write_bytes(bytes(bad))
    refused(b.client, paths, sizes, sums, "is corrupt (crc32", before)
    # a flipped byte in the header
    bad = bytearray(good)
    bad[30] ^= 1
    f0.write_bytes(bytes(bad))
    refused(b.client, paths, sizes, sums, "corrupt header", before)
    # another format version (header checksum fixed up, so only the version is wrong)
    import struct
    import zlib

    bad = bytearray(good)
    bad[8:12] = struct.pack("<I", 4)
    # version 3, one table: its 72 fixed bytes, name, rows, counts and crc per partition
    hlen = 48 + 72 + len("embedding") + 4096 * 20
    bad[hlen : hlen + 4] = struct.pack("<I", zlib.crc32(bytes(bad[:hlen])))
    f0.write_bytes(bytes(bad))
    refused(b.client, paths, [], [], "format version 4, this build reads versions 1 to 3", before)
    # the other file of another checkpoint, same size
    f0.write_bytes(good)
    msg = refused(b.client, paths, sizes, [sums[0] ^ 1, sums[1]], "is not the manifest's", before)
    assert paths[0] in msg
    # not a checkpoint at all
    f0.write_bytes(b"\0" * len(good))
    refused(b.client, paths, sizes, sums, "bad magic", before)
    f0.write_bytes(good)
    # other dimension: refused naming the table and the field
    c = shards(1, dim=DIM * 2)
    with pytest.raises(PSError, match="table 'embedding' has dim 8 in the checkpoint, 16 on"):
        c.client.load(paths, sizes, sums)
    # a shard without the table gets it, from the file's spec, beside its own
    d = shards(1, table="other")
    d.client.load(paths, sizes, sums)
    assert [t["name"] for t in d.client.health()[0]["tables"]] == ["embedding", "other"]
    plain = Client([s.address for s in d.servers], TOKEN, DIM, timeout_s=30.0)
    assert_same(dump(plain), dump(a.client))
    # the good files still load
    b.client.load(paths, sizes, sums)
    assert_same(dump(b.client), dump(a.client))


def test_paths_stay_inside_the_checkpoint_directory(shards):
    a = shards(1)
    for bad in ["/etc/passwd", "../x.bin", "a/../../x", "", "a//b"]:
        with pytest.raises(PSError, match="INVALID_ARGUMENT: checkpoint path"):
            a.client.save([bad], 1)
        with pytest.raises(PSError, match="INVALID_ARGUMENT"):
            a.client.load([bad])


def test_refusals_without_directory_with_open_session_or_off_the_boundary(shards, tmp_path):
    srv = Server(DIM, TOKEN, init_scale=0.1)
    srv.start()
    try:
        cl = Client([srv.address], TOKEN, DIM, timeout_s=10.0)
        with pytest.raises(PSError, match="FAILED_PRECONDITION: this shard has no checkpoint"):
            cl.save(["a.bin"], 1)
    finally:
        srv.stop(2.0)
    a = shards(1)
    keys = np.arange(10, dtype=np.int64)
    a.client.commit(42, 0, 0, 2, keys, np.ones((10, DIM), np.float32), 0.1)  # 1 of 2 ranks
    with pytest.raises(PSError, match="session 42 has committed step -1, not 0"):
        a.client.save(["s.bin"], 0, 42, 0)
    a.client.save(["s.bin"], 0, 42, -1)  # before step 0: at a boundary
    with pytest.raises(PSError, match="FAILED_PRECONDITION: a commit session is open"):
        a.client.load(["s.bin"])


def test_standalone_server_saves_and_loads_on_request(tmp_path):
    """python -m cpu_dist.sparse.server --checkpoint-dir: the Save/Load RPCs for tools."""
    token = tmp_path / "token"
    write_token_file(str(token), TOKEN)
    extra = ["--checkpoint-dir", str(tmp_path / "ck")]  # two shards 0 of 1: one file serves both
    with (
        standalone_shard(str(token), DIM, extra=extra) as (addr_a, proc_a),
        standalone_shard(str(token), DIM, extra=extra) as (addr_b, proc_b),
    ):
        a, b = (Client([x], TOKEN, DIM, timeout_s=30.0) for x in (addr_a, addr_b))
        train_some(a)
        res = a.save(["one/shard.bin"], 3)
        assert (tmp_path / "ck" / "one" / "shard.bin").stat().st_size == res[0]["bytes"]
        assert b.load(["one/shard.bin"], [res[0]["bytes"]], [res[0]["checksum"]])[0]["step"] == 3
        assert_same(dump(b), dump(a))
        assert (stop(proc_a), stop(proc_b)) == (0, 0)
