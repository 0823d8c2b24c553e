"""Shard checkpoint files of many tables (format 3) on real in-process shards: tables of
different widths and optimizers saved by 2 shards load into 1 and 3 with the same rows, into
shards that lack them (created from the file's specs), refused naming the table and the field
for another spec (nothing changed); format 2 files, written by the build before tables, load
into the default table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cpu_dist.sparse import Client, PSError, Server

pytestmark = pytest.mark.timeout(180)
TOKEN = "ckpt-tables"
SPECS = [
    {"name": "ads", "dim": 4, "optimizer": "sgd", "init_scale": 0.5, "seed": 3},
    {"name": "item", "dim": 16, "optimizer": "rowwise_adagrad", "init_scale": 0.25, "seed": 3},
    {
        "name": "user",
        "dim": 8,
        "optimizer": "adagrad",
        "init_scale": 0.125,
        "seed": 3,
        "eps": 1e-8,
    },
]
FORMAT2 = Path(__file__).parent / "data" / "format2"


class Shards:
    def __init__(self, n: int, root: Path, tables: list[dict] | None = SPECS, **kw) -> None:
        dim = kw.pop("dim", 0)
        self.servers = [
            Server(
                dim,
                TOKEN,
                shard_index=i,
                num_shards=n,
                checkpoint_dir=str(root),
                **({"tables": tables} if tables else {}),
                **kw,
            )
            for i in range(n)
        ]
        for s in self.servers:
            s.start()
        names = [(t["name"], t["dim"]) for t in SPECS]
        self.client = Client([s.address for s in self.servers], TOKEN, tables=names, timeout_s=30.0)

    def stop(self) -> None:
        for s in self.servers:
            s.stop(2.0)


@pytest.fixture
def shards(tmp_path):
    made: list[Shards] = []

    def make(n: int, **kw) -> Shards:
        s = Shards(n, tmp_path, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def train(client: Client, rounds: int = 3, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        parts = {}
        for t in SPECS:
            keys = np.unique(rng.integers(-500, 500, 400)).astype(np.int64)
            grads = rng.standard_normal((len(keys), t["dim"])).astype(np.float32)
            parts[t["name"]] = (keys, grads, 0.1)
        client.push_tables(parts)


def dumps(client: Client) -> dict[str, tuple[np.ndarray, ...]]:
    out = {}
    for t in SPECS:
        k, v, s = client.dump(table=t["name"])
        out[t["name"]] = (k.copy(), v.copy(), s.copy())
    return out


def assert_same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for name in a:
        for x, y in zip(a[name], b[name]):
            np.testing.assert_array_equal(x, y, err_msg=name)


def save(client: Client, name: str, step: int = 4):
    n = client.num_shards
    paths = [f"{name}/shard-{i}-of-{n}.bin" for i in range(n)]
    res = client.save(paths, step)
    return paths, [r["bytes"] for r in res], [r["checksum"] for r in res], res


def test_tables_of_several_widths_and_optimizers_restore_into_any_shard_count(shards):
    a = shards(2)
    train(a.client)
    want = dumps(a.client)
    assert want["user"][2].shape == (len(want["user"][0]), 8)  # Adagrad: dim floats a row
    assert np.abs(want["user"][2]).max() > 0 and np.abs(want["item"][2]).max() > 0
    paths, sizes, sums, res = save(a.client, "two")
    assert sum(r["rows"] for r in res) == sum(len(d[0]) for d in want.values())
    for dst in (1, 3):
        b = shards(dst)
        loaded = b.client.load(paths, sizes, sums)
        assert sum(r["rows"] for r in loaded) == sum(len(d[0]) for d in want.values())
        assert all(r["step"] == 4 for r in loaded)
        assert_same(dumps(b.client), want)
        # each shard holds the rows it owns (salted per table): pulls agree with the source
        probe = {t["name"]: want[t["name"]][0][::5] for t in SPECS}
        got, ref = b.client.pull_tables(probe), a.client.pull_tables(probe)
        for name in probe:
            np.testing.assert_array_equal(got[name], ref[name], err_msg=name)
        # ... and training goes on identically
        train(b.client, rounds=1, seed=9)
    train(a.client, rounds=1, seed=9)
    assert_same(dumps(b.client), dumps(a.client))


def test_tables_a_shard_lacks_are_created_from_the_files_specs(shards):
    a = shards(2)
    train(a.client)
    want = dumps(a.client)
    paths, sizes, sums, _ = save(a.client, "x")
    bare = shards(1, tables=None)  # no table at all
    bare.client.load(paths, sizes, sums)
    assert_same(dumps(bare.client), want)
    held = {t["name"]: t for t in bare.client.health()[0]["tables"]}
    for spec in SPECS:
        for key, value in spec.items():
            assert held[spec["name"]][key] == pytest.approx(value), (spec["name"], key)


def test_another_spec_is_refused_naming_the_table_and_the_field(shards):
    a = shards(2)
    train(a.client)
    paths, sizes, sums, _ = save(a.client, "y")
    other = [dict(t) for t in SPECS]
    other[1] = {**other[1], "optimizer": "sgd"}
    b = shards(1, tables=other[1:2])  # only 'item', with another optimizer
    three = np.arange(3, dtype=np.int64)
    b.client.push_tables({"item": (three, np.ones((3, 16), np.float32), 1.0)})
    before = b.client.dump(table="item")
    with pytest.raises(PSError) as ei:
        b.client.load(paths, sizes, sums)
    msg = str(ei.value)
    assert "table 'item' has optimizer rowwise_adagrad in the checkpoint, sgd on this shard" in msg
    assert paths[0] in msg
    after = b.client.dump(table="item")
    for x, y in zip(before, after):
        np.testing.assert_array_equal(x, y)  # nothing loaded
    names = [t["name"] for t in b.client.health()[0]["tables"]]
    assert names == ["item"]  # and no table created


def test_the_files_of_one_checkpoint_must_agree(shards, tmp_path):
    a = shards(2)
    train(a.client)
    p1, *_ = save(a.client, "s1", step=4)
    train(a.client, rounds=1)
    p2, *_ = save(a.client, "s2", step=5)
    b = shards(1)
    with pytest.raises(PSError, match=r"holds step 5, .* holds step 4"):
        b.client.load([p1[0], p2[1]], [], [])


def _format2_dump():
    with np.load(FORMAT2 / "dump.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("dst", [1, 3])
def test_format_2_files_load_into_the_default_table(tmp_path, dst):
    """Files written by the build before tables (59d5073: 2 shards, table 'embedding' of dim
    4, row-wise Adagrad, admit_after 2, 6 committed steps) hold the same rows and counts."""
    root = tmp_path / "ck"
    (root / "old").mkdir(parents=True)
    for f in FORMAT2.glob("*.bin"):
        (root / "old" / f.name).write_bytes(f.read_bytes())
    want = _format2_dump()
    servers = [
        Server(
            4,
            TOKEN,
            init_scale=0.1,
            seed=5,
            admit_after=2,
            shard_index=i,
            num_shards=dst,
            checkpoint_dir=str(root),
        )
        for i in range(dst)
    ]
    for s in servers:
        s.start()
    try:
        cl = Client([s.address for s in servers], TOKEN, 4, timeout_s=30.0)
        paths = [f"old/shard-{i:05d}-of-00002.bin" for i in range(2)]
        loaded = cl.load(paths, [int(b) for b in want["bytes"]], [int(c) for c in want["checksum"]])
        assert sum(r["rows"] for r in loaded) == len(want["keys"])
        assert all(r["step"] == 5 for r in loaded)
        k, v, st = cl.dump()
        np.testing.assert_array_equal(k, want["keys"])
        np.testing.assert_array_equal(v, want["values"])
        np.testing.assert_array_equal(st, want["state"])
        assert sum(s.stats()["pending_counts"] for s in servers) == int(want["pending"].sum())
        # A save of it now writes format 3, and that loads back the same.
        res = cl.save([f"new/{i}.bin" for i in range(dst)], 5)
        assert sum(r["rows"] for r in res) == len(want["keys"])
        head = (root / "new" / "0.bin").read_bytes()[:12]
        assert head[:8] == b"CPUDPSCK" and int.from_bytes(head[8:12], "little") == 3
    finally:
        for s in servers:
            s.stop(2.0)


def test_a_format_2_file_needs_a_one_float_state(tmp_path):
    root = tmp_path / "ck"
    (root / "old").mkdir(parents=True)
    for f in FORMAT2.glob("*.bin"):
        (root / "old" / f.name).write_bytes(f.read_bytes())
    spec = {"name": "embedding", "dim": 4, "optimizer": "adagrad", "init_scale": 0.1, "seed": 5}
    s = Server(0, TOKEN, tables=[spec], checkpoint_dir=str(root))
    s.start()
    try:
        cl = Client([s.address], TOKEN, 4, timeout_s=30.0)
        with pytest.raises(PSError, match="one optimizer state float a row; table 'embedding'"):
            cl.load([f"old/shard-{i:05d}-of-00002.bin" for i in range(2)], [], [])
    finally:
        s.stop(2.0)


def test_tiered_shards_restore_and_save_every_table(shards, tmp_path):
    """Into 3 shards with a tiny DRAM byte budget (most rows of every table on SSD), and
    saved from there (DRAM and SSD rows merged per table) back into 1 shard: the same rows."""
    a = shards(2)
    train(a.client)
    want = dumps(a.client)
    paths, sizes, sums, _ = save(a.client, "t")
    b = shards(3, memory_bytes=20000, ssd_dir=str(tmp_path / "ssd"))
    b.client.load(paths, sizes, sums)
    assert_same(dumps(b.client), want)
    on_ssd = [t["rows_ssd"] for s in b.servers for t in s.stats()["tables"]]
    assert len(on_ssd) == 9 and min(on_ssd) > 0
    again = save(b.client, "u")
    c = shards(1)
    c.client.load(*again[:3])
    assert_same(dumps(c.client), want)


def write_format_1(path: Path, keys: np.ndarray, values: np.ndarray, state: np.ndarray) -> None:
    """A version 1 file as checkpoint_format.h defines it (written here from that text, by
    numpy): the fixed header, the name, rows and crc32 per partition, the header crc, blocks
    of keys, values and one state float a row (no steps, no counts)."""
    import struct
    import zlib

    from cpu_dist.common.contracts import NUM_PARTITIONS, partition_of

    part = partition_of(keys)
    name = b"embedding"
    rows = np.bincount(part, minlength=NUM_PARTITIONS).astype("<u8")
    blocks, crcs = [], np.zeros(NUM_PARTITIONS, "<u4")
    for p in np.flatnonzero(rows):
        at = np.flatnonzero(part == p)
        at = at[np.argsort(keys[at])]
        block = b"".join(
            [keys[at].astype("<i8").tobytes(), values[at].astype("<f4").tobytes(),
             state[at].astype("<f4").tobytes()]
        )  # fmt: skip
        crcs[p] = zlib.crc32(block)
        blocks.append(block)
    head = b"CPUDPSCK" + struct.pack(
        "<IIIIqQII", 1, values.shape[1], 0, 1, 5, len(keys), NUM_PARTITIONS, len(name)
    )
    head += name + rows.tobytes() + crcs.tobytes()
    path.write_bytes(head + struct.pack("<I", zlib.crc32(head)) + b"".join(blocks))


def test_a_format_1_file_loads_into_the_default_table(tmp_path):
    """Its rows and states, no counts and no last-update steps, into 2 shards."""
    want = _format2_dump()
    root = tmp_path / "ck"
    root.mkdir()
    write_format_1(root / "v1.bin", want["keys"], want["values"], want["state"])
    servers = [
        Server(4, TOKEN, init_scale=0.1, seed=5, shard_index=i, num_shards=2,
               checkpoint_dir=str(root))
        for i in range(2)
    ]  # fmt: skip
    for s in servers:
        s.start()
    try:
        cl = Client([s.address for s in servers], TOKEN, 4, timeout_s=30.0)
        loaded = cl.load(["v1.bin"], [], [])
        assert sum(r["rows"] for r in loaded) == len(want["keys"])
        k, v, st = cl.dump()
        np.testing.assert_array_equal(k, want["keys"])
        np.testing.assert_array_equal(v, want["values"])
        np.testing.assert_array_equal(st, want["state"])
        assert sum(s.stats()["pending_counts"] for s in servers) == 0
    finally:
        for s in servers:
            s.stop(2.0)
