"""A checkpoint load of several tables is all or nothing on the shard: one that fails part way
(a corrupt block in the last table's data, found only when that table's rows are read) leaves
every shard as it was before the load: the same tables (none created empty by the load, also
on a shard whose own PREPARE succeeded before another shard's failed), the same rows.  The
same files, undamaged, then load and create the tables (so the refusal is the damage's)."""

from __future__ import annotations

import shutil

import grpc
import numpy as np
import pytest

from cpu_dist.common.tables import TableConfig
from cpu_dist.sparse import Client, PSError, Server
from cpu_dist.sparse.grpc_stubs import token_metadata

from .conftest import TOKEN

pytestmark = pytest.mark.timeout(120)


def spec(name: str, dim: int, optimizer: str) -> dict:
    """A shard's spec dict, made where the job makes its own (TableConfig.spec)."""
    return TableConfig(name, dim, (), optimizer=optimizer, init_scale=0.1).spec(seed=5)


SPECS = [spec("a", 4, "sgd"), spec("b", 8, "rowwise_adagrad"), spec("c", 16, "adagrad")]
KEYS = np.arange(0, 3000, 7, dtype=np.int64)  # every partition of every shard has rows


class Shards:
    def __init__(self, n: int, specs: list[dict], ckpt: str):
        self.specs = specs
        self.servers = [
            Server(0, TOKEN, shard_index=i, num_shards=n, tables=specs, checkpoint_dir=ckpt)
            for i in range(n)
        ]
        for s in self.servers:
            s.start()

    def client(self, specs: list[dict] | None = None) -> Client:
        specs = self.specs if specs is None else specs
        return Client(
            [s.address for s in self.servers],
            TOKEN,
            0,
            tables=[(s["name"], s["dim"]) for s in specs],
            timeout_s=20.0,
        )

    def tables(self) -> list[dict[str, int]]:
        """Per shard: each table's rows."""
        return [{t["name"]: t["rows"] for t in s.stats()["tables"]} for s in self.servers]

    def stop(self) -> None:
        for s in self.servers:
            s.stop(2.0)


@pytest.fixture
def shards():
    made: list[Shards] = []

    def make(n: int, specs: list[dict], ckpt: str) -> Shards:
        s = Shards(n, specs, ckpt)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def push(cl: Client, specs: list[dict], seed: int) -> None:
    rng = np.random.default_rng(seed)
    cl.push_tables(
        {
            s["name"]: (KEYS, rng.standard_normal((len(KEYS), s["dim"])).astype(np.float32), 0.1)
            for s in specs
        }
    )


def dumps(cl: Client, names: list[str]) -> dict[str, tuple]:
    out = {}
    for n in names:
        keys, values, state = cl.dump(table=n)
        order = np.argsort(keys)
        out[n] = (keys[order], values[order], state[order])
    return out


@pytest.mark.parametrize("num_shards", [1, 2])  # 1: one LOAD; 2: PREPARE on both, then ABORT
def test_a_load_failing_in_its_last_table_leaves_every_shard_as_before(
    shards, tmp_path, num_shards
):
    ck = tmp_path / "ck"
    src = shards(2, SPECS, str(ck))
    push(src.client(), SPECS, seed=1)
    paths = [f"good/shard-{i}-of-2.bin" for i in range(2)]
    res = src.client().save(paths, 3)
    sizes, sums = [r["bytes"] for r in res], [r["checksum"] for r in res]
    # The last bytes of every file are table 'c''s last block: its checksum fails only when
    # 'c' is read, after 'a' and 'b' were staged (the header, and its checksum, are intact).
    shutil.copytree(ck / "good", ck / "bad")
    for i in range(2):
        f = ck / "bad" / f"shard-{i}-of-2.bin"
        data = bytearray(f.read_bytes())
        data[-1] ^= 0xFF
        f.write_bytes(bytes(data))

    dst = shards(num_shards, SPECS[:1], str(ck))  # holds table 'a' only, with its own rows
    push(dst.client(), SPECS[:1], seed=2)
    before_tables = dst.tables()
    before = dumps(dst.client(), ["a"])
    with pytest.raises(PSError) as ei:
        dst.client().load([p.replace("good", "bad") for p in paths], sizes, sums)
    assert ei.value.code == "DATA_LOSS", ei.value
    assert "table 'c'" in str(ei.value) and "bad/shard-" in str(ei.value), ei.value
    assert dst.tables() == before_tables  # no table 'b' or 'c' made empty by the load
    for name, arrays in dumps(dst.client(), ["a"]).items():
        for got, want in zip(arrays, before[name]):
            np.testing.assert_array_equal(got, want)

    # The same files undamaged: every table comes, with the source's rows.
    dst.client().load(paths, sizes, sums)
    names = [s["name"] for s in SPECS]
    assert [sorted(t) for t in dst.tables()] == [names] * num_shards
    want = dumps(src.client(), names)
    for name, arrays in dumps(dst.client(SPECS), names).items():
        for got, w in zip(arrays, want[name]):
            np.testing.assert_array_equal(got, w)


def test_a_table_created_between_prepare_and_commit_fails_the_commit_changing_nothing(
    shards, tmp_path, pb
):
    """The tables a PREPARE built join the shard at COMMIT; one whose name the shard took
    meanwhile (CreateTables) fails the COMMIT, naming it, with no table changed or added."""
    ck = tmp_path / "ck"
    src = shards(1, SPECS, str(ck))
    push(src.client(), SPECS, seed=1)
    saved = src.client().save(["s.bin"], 3)[0]
    dst = shards(1, SPECS[:1], str(ck))
    push(dst.client(), SPECS[:1], seed=2)
    before = dumps(dst.client(), ["a"])
    ps_pb2, ps_grpc = pb
    md = token_metadata(TOKEN)
    with grpc.insecure_channel(dst.servers[0].address) as channel:
        stub = ps_grpc.ParameterServerStub(channel)

        def load(stage):
            req = ps_pb2.LoadRequest(stage=stage)
            if stage == ps_pb2.PREPARE:
                req.paths.append(b"s.bin")
                req.sizes.append(saved["bytes"])
                req.checksums.append(saved["checksum"])
            return stub.Load(req, metadata=md, timeout=30)

        assert load(ps_pb2.PREPARE).rows == 3 * len(KEYS)
        assert sorted(dst.tables()[0]) == ["a"]  # the prepared tables are not on the shard yet
        dst.client().create_tables([SPECS[1]])  # 'b', empty, by another client
        with pytest.raises(grpc.RpcError) as ei:
            load(ps_pb2.COMMIT)
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "table 'b' was created on this shard meanwhile" in ei.value.details()
    assert dst.tables() == [{"a": len(KEYS), "b": 0}]
    for got, want in zip(dumps(dst.client(), ["a"])["a"], before["a"]):
        np.testing.assert_array_equal(got, want)


def test_a_failed_load_into_tiered_shards_leaves_no_table_and_no_store(shards, tmp_path):
    """Tables built for a load on shards with an SSD tier and a byte budget: a failed load
    leaves neither them nor their stores (the SSD directory holds only what it held); the
    same files undamaged load with the source's rows, most of them on SSD."""
    ck, ssd = tmp_path / "ck", tmp_path / "ssd"
    src = shards(1, SPECS, str(ck))
    push(src.client(), SPECS, seed=3)
    saved = src.client().save(["s.bin"], 3)[0]
    data = bytearray((ck / "s.bin").read_bytes())
    data[-1] ^= 0xFF  # in 'c''s last block
    (ck / "bad.bin").write_bytes(bytes(data))
    dst = [
        Server(
            0,
            TOKEN,
            shard_index=i,
            num_shards=2,
            checkpoint_dir=str(ck),
            memory_bytes=8000,
            ssd_dir=str(ssd),
        )
        for i in range(2)
    ]
    try:
        for s in dst:
            s.start()
        cl = Client(
            [s.address for s in dst],
            TOKEN,
            0,
            tables=[(s["name"], s["dim"]) for s in SPECS],
            timeout_s=20.0,
        )
        stores = sorted(p.name for p in ssd.iterdir()) if ssd.exists() else []
        with pytest.raises(PSError, match="table 'c': partition"):
            cl.load(["bad.bin"], [saved["bytes"]], [saved["checksum"]])
        assert [s.stats()["tables"] for s in dst] == [[], []]
        assert (sorted(p.name for p in ssd.iterdir()) if ssd.exists() else []) == stores
        cl.load(["s.bin"], [saved["bytes"]], [saved["checksum"]])
        names = [s["name"] for s in SPECS]
        want = dumps(src.client(), names)
        for name, arrays in dumps(cl, names).items():
            for got, w in zip(arrays, want[name]):
                np.testing.assert_array_equal(got, w)
        assert sum(t["rows_ssd"] for s in dst for t in s.stats()["tables"]) > 0
        cl.close()
    finally:
        for s in dst:
            s.stop(2.0)
