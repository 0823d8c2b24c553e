"""The DRAM/SSD tiers of a shard (csrc/table.h, csrc/tier_store.h): a shard whose DRAM tier
holds a few dozen rows gives the same bits as an all-DRAM one for every push, commit, pull,
dump, save and load; without an SSD tier a full DRAM tier refuses the whole update; the SSD
tier's directory goes when the shard stops."""

from __future__ import annotations

import struct
import threading
import zlib

import numpy as np
import pytest

from cpu_dist.common import contracts
from cpu_dist.sparse import PSError, Server

from .conftest import TOKEN, rng_grads

pytestmark = pytest.mark.timeout(180)
DIM = 8
KEYS = 3000  # key space of the workload; a tiered shard holds 40 rows in DRAM


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def assert_same_dump(a, b):
    ka, va, sa = a.client().dump()
    kb, vb, sb = b.client().dump()
    assert np.array_equal(ka, kb)
    assert np.array_equal(bits(va), bits(vb))
    assert np.array_equal(bits(sa), bits(sb))
    return len(ka)


def workload(clusters, optimizer: str, seed: int = 0, steps: int = 6, session: int = 11):
    """The same pushes, two-rank commits and pulls into every cluster; pulls must agree."""
    rng = np.random.default_rng(seed)
    clients = [c.client() for c in clusters]
    for s in range(steps):
        keys = rng.integers(-KEYS // 2, KEYS // 2, 400).astype(np.int64)  # duplicates too
        grads = rng_grads(rng, len(keys), DIM)
        for cl in clients:
            cl.push(keys, grads, 0.05, optimizer)
        per_rank = []
        for _ in range(2):
            k = np.unique(rng.integers(-KEYS // 2, KEYS // 2, 300)).astype(np.int64)
            per_rank.append((k, rng_grads(rng, len(k), DIM)))
        for cl in clients:
            for r, (k, g) in enumerate(per_rank):
                cl.commit(session, s, r, 2, k, g, 0.1, optimizer)
            assert cl.wait_committed(session, s, 20.0) == s
        probe = rng.integers(-KEYS, KEYS, 500).astype(np.int64)  # absent ones too
        got = [cl.pull(probe) for cl in clients]
        for g in got[1:]:
            assert np.array_equal(bits(g), bits(got[0]))


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
@pytest.mark.parametrize("num_shards", [1, 3])
def test_a_small_dram_tier_gives_the_bits_of_an_all_dram_shard(
    cluster_factory, tmp_path, optimizer, num_shards
):
    dram = cluster_factory(num_shards, DIM)
    tiered = cluster_factory(num_shards, DIM, memory_rows=40, ssd_dir=str(tmp_path / "ssd"))
    workload([dram, tiered], optimizer)
    rows = assert_same_dump(dram, tiered)
    assert dram.rows() == tiered.rows() == rows
    for srv in tiered.servers:
        st = srv.stats()
        assert st["rows_dram"] <= 40 and st["rows_ssd"] > 0
        assert st["rows_dram"] + st["rows_ssd"] == st["rows"]
        assert st["ssd_bytes"] > 0
    assert all(s.stats()["rows_ssd"] == 0 for s in dram.servers)
    assert_same_dump(dram, tiered)  # the dump moved nothing


def test_pages_of_a_dump_cover_both_tiers(cluster_factory, tmp_path):
    dram = cluster_factory(2, DIM)
    tiered = cluster_factory(2, DIM, memory_rows=25, ssd_dir=str(tmp_path / "ssd"))
    workload([dram, tiered], "sgd", steps=2)
    want = dram.client().dump()
    row_bytes = 8 + (DIM + 1) * 4
    for page_rows in (1, 7, 100):  # pages cut inside partitions and across them
        got = tiered.client().dump(max_bytes=page_rows * row_bytes)
        for x, y in zip(want, got):
            assert np.array_equal(x, y)


def test_pulls_during_commits_keep_the_bits(cluster_factory, tmp_path):
    """Pulls move rows between the tiers while commits update them: the result is still the
    all-DRAM shard's."""
    dram = cluster_factory(1, DIM)
    tiered = cluster_factory(1, DIM, memory_rows=30, ssd_dir=str(tmp_path / "ssd"))
    stop = threading.Event()
    errors: list[BaseException] = []

    def pull_loop():
        cl = tiered.client()
        rng = np.random.default_rng(9)
        try:
            while not stop.is_set():
                cl.pull(rng.integers(-KEYS, KEYS, 200).astype(np.int64))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=pull_loop) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        workload([dram, tiered], "rowwise_adagrad", seed=3, steps=8)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    assert_same_dump(dram, tiered)


def test_without_an_ssd_tier_a_full_dram_tier_refuses_the_whole_update(cluster_factory):
    c = cluster_factory(1, DIM, memory_rows=100)
    cl = c.client()
    g = np.ones((80, DIM), np.float32)
    cl.push(np.arange(80, dtype=np.int64), g, 0.1)
    before = cl.dump()
    # 50 keys, 40 of them new: 120 rows > 100.  Nothing of the push is applied.
    with pytest.raises(PSError, match=r"RESOURCE_EXHAUSTED") as ei:
        cl.push(np.arange(70, 120, dtype=np.int64), np.ones((50, DIM), np.float32), 0.1)
    msg = str(ei.value)
    assert "--ps-memory-rows 100" in msg and "--ps-ssd-dir" in msg
    for x, y in zip(before, cl.dump()):
        assert np.array_equal(x, y)
    cl.push(np.arange(60, 100, dtype=np.int64), np.ones((40, DIM), np.float32), 0.1)  # fits
    assert c.rows() == 100
    before = cl.dump()
    # A step that would exceed it fails the session; the table is untouched.
    k = np.arange(95, 105, dtype=np.int64)
    with pytest.raises(PSError, match=r"RESOURCE_EXHAUSTED.*step 0 .*--ps-memory-rows"):
        cl.commit(3, 0, 0, 1, k, np.ones((10, DIM), np.float32), 0.1)
    for x, y in zip(before, cl.dump()):
        assert np.array_equal(x, y)
    assert c.rows() == 100


def test_the_ssd_tier_is_working_storage_removed_with_the_shard(tmp_path):
    ssd = tmp_path / "ssd"
    srv = Server(DIM, TOKEN, init_scale=0.1, memory_rows=5, ssd_dir=str(ssd))
    srv.start()
    stores = list(ssd.iterdir())
    assert len(stores) == 1 and stores[0].name.startswith("shard-0-")
    srv.stop(2.0)
    del srv
    assert list(ssd.iterdir()) == []
    with pytest.raises(ValueError, match="needs memory_rows >= 1"):
        Server(DIM, TOKEN, init_scale=0.1, ssd_dir=str(ssd))
    with pytest.raises(ValueError, match="absolute path"):
        Server(DIM, TOKEN, init_scale=0.1, memory_rows=5, ssd_dir="relative/dir")


# ---- checkpoints ------------------------------------------------------------------------


def save(cluster, name: str, step: int):
    cl = cluster.client()
    n = cl.num_shards
    paths = [f"{name}/shard-{i}-of-{n}.bin" for i in range(n)]
    res = cl.save(paths, step)
    return paths, [r["bytes"] for r in res], [r["checksum"] for r in res]


def test_save_and_load_read_and_write_both_tiers(cluster_factory, tmp_path):
    ck = tmp_path / "ck"
    dram = cluster_factory(2, DIM, checkpoint_dir=str(ck))
    tiered = cluster_factory(
        2, DIM, checkpoint_dir=str(ck), memory_rows=30, ssd_dir=str(tmp_path / "ssd")
    )
    workload([dram, tiered], "rowwise_adagrad", steps=4)
    p_dram, _, _ = save(dram, "dram", 3)
    paths, sizes, sums = save(tiered, "tiered", 3)
    for a, b in zip(p_dram, paths):  # the same rows, state and steps: the same bytes
        assert (ck / a).read_bytes() == (ck / b).read_bytes()
    # Restore into other shard counts, tiered (rows beyond the budget go to SSD) or not.
    three = cluster_factory(
        3, DIM, checkpoint_dir=str(ck), memory_rows=20, ssd_dir=str(tmp_path / "ssd3")
    )
    one = cluster_factory(1, DIM, checkpoint_dir=str(ck))
    for c in (three, one):
        loaded = c.client().load(paths, sizes, sums)
        assert sum(r["rows"] for r in loaded) == dram.rows()
        assert_same_dump(dram, c)
    st = [s.stats() for s in three.servers]
    assert all(s["rows_dram"] <= 20 and s["rows_ssd"] > 0 for s in st)
    # Training goes on identically from the restored tables.
    workload([dram, three, one], "rowwise_adagrad", seed=5, steps=2, session=12)
    assert_same_dump(dram, three)
    assert_same_dump(dram, one)


def test_a_load_larger_than_the_dram_tier_without_ssd_is_refused(cluster_factory, tmp_path):
    ck = tmp_path / "ck"
    a = cluster_factory(1, DIM, checkpoint_dir=str(ck))
    a.client().push(np.arange(50, dtype=np.int64), np.ones((50, DIM), np.float32), 0.1)
    paths, sizes, sums = save(a, "x", 0)
    b = cluster_factory(1, DIM, checkpoint_dir=str(ck), memory_rows=49)
    with pytest.raises(PSError, match=r"holds 50 rows.*--ps-memory-rows 49.*--ps-ssd-dir"):
        b.client().load(paths, sizes, sums)
    assert b.rows() == 0


def write_v1_file(path, keys, values, state, dim, step):
    """A format version 1 shard file (checkpoint_format.h before version 2), from its spec."""
    keys = np.asarray(keys, np.int64)
    part = contracts.partition_of(keys)
    order = np.lexsort((keys, part))
    keys, values, state, part = keys[order], values[order], state[order], part[order]
    rows = np.bincount(part, minlength=4096).astype(np.uint64)
    blocks, crcs = [], np.zeros(4096, np.uint32)
    for p in np.flatnonzero(rows):
        m = part == p
        b = keys[m].tobytes() + values[m].astype(np.float32).tobytes() + state[m].tobytes()
        crcs[p] = zlib.crc32(b)
        blocks.append(b)
    table = b"embedding"
    head = b"CPUDPSCK" + struct.pack("<IIIIqQII", 1, dim, 0, 1, step, len(keys), 4096, len(table))
    head += table + rows.tobytes() + crcs.tobytes()
    head += struct.pack("<I", zlib.crc32(head))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head + b"".join(blocks))
    return len(head) + sum(len(b) for b in blocks), zlib.crc32(head[:-4])


def test_version_1_files_still_load_and_their_rows_never_expire_until_updated(
    cluster_factory, tmp_path
):
    ck = tmp_path / "ck"
    rng = np.random.default_rng(2)
    keys = rng.choice(np.arange(-5000, 5000), 200, replace=False).astype(np.int64)
    values = rng_grads(rng, 200, DIM)
    state = np.abs(rng_grads(rng, 200, 1))[:, 0]
    size, crc = write_v1_file(ck / "v1" / "shard.bin", keys, values, state, DIM, 41)
    c = cluster_factory(
        2,
        DIM,
        checkpoint_dir=str(ck),
        memory_rows=30,
        ssd_dir=str(tmp_path / "ssd"),
        expire_after=1,
    )
    cl = c.client()
    loaded = cl.load(["v1/shard.bin"], [size], [crc])
    assert sum(r["rows"] for r in loaded) == 200 and loaded[0]["step"] == 41
    k, v, s = cl.dump()
    order = np.argsort(keys)
    assert np.array_equal(k, keys[order])
    assert np.array_equal(bits(v), bits(values[order]))
    assert np.array_equal(bits(s), bits(state[order]))
    # Steps on other keys expire nothing loaded (no last-update step); a step that updates a
    # loaded row gives it one, and it expires one step later.
    other = np.array([10**9], np.int64)
    none_k, none_g = np.zeros(0, np.int64), np.zeros((0, DIM), np.float32)
    one = np.ones((1, DIM), np.float32)
    steps = [(other, one), (none_k, none_g), (none_k, none_g)]  # job steps 42, 43, 44
    for step, (k, g) in enumerate(steps):
        cl.commit(5, step, 0, 1, k, g, 0.1, base_step=42)
    assert cl.wait_committed(5, 2, 10.0) == 2
    assert c.rows() == 200  # `other`, updated at 42, expired at 43
    cl.commit(5, 3, 0, 1, keys[:3], np.ones((3, DIM), np.float32), 0.1, base_step=42)
    cl.commit(5, 4, 0, 1, none_k, none_g, 0.1, base_step=42)
    assert cl.wait_committed(5, 4, 10.0) == 4
    assert c.rows() == 197 and sum(s.stats()["rows_expired"] for s in c.servers) == 4
