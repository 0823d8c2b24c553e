"""Checkpoint I/O paths (csrc/checkpoint_stream.h): files written with O_DIRECT and through
the page cache (CPU_DIST_CHECKPOINT_DIRECT=0, or where O_DIRECT is refused) are the same bytes;
restores read chunks on worker threads and insert big blocks with two threads, across shard
counts and into tiered shards, and give back every row, state and step."""

from __future__ import annotations

import numpy as np
import pytest


def fill(cl, n: int, dim: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for lo in range(0, n, 250_000):
        k = np.arange(lo, min(n, lo + 250_000), dtype=np.int64) * 7919  # spread over partitions
        cl.push(k, rng.standard_normal((len(k), dim)).astype(np.float32), 0.1, "rowwise_adagrad")


def sorted_dump(clients) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    parts = [cl.dump() for cl in clients]
    k = np.concatenate([p[0] for p in parts])
    order = np.argsort(k)
    return (
        k[order],
        np.concatenate([p[1] for p in parts])[order],
        np.concatenate([p[2] for p in parts])[order],
    )


def same_rows(a, b) -> None:
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_direct_and_buffered_io_give_the_same_file(cluster_factory, tmp_path, monkeypatch):
    disk = cluster_factory(num_shards=1, dim=8, checkpoint_dir=str(tmp_path))
    fill(disk.client(), 60_000, 8)
    saved = disk.client().save(["direct.bin"], 3)[0]
    monkeypatch.setenv("CPU_DIST_CHECKPOINT_DIRECT", "0")  # through the page cache
    assert disk.client().save(["buffered.bin"], 3)[0] == saved
    assert (tmp_path / "buffered.bin").read_bytes() == (tmp_path / "direct.bin").read_bytes()
    for name, direct in (("direct.bin", "0"), ("buffered.bin", "1")):  # read the other way
        monkeypatch.setenv("CPU_DIST_CHECKPOINT_DIRECT", direct)
        dst = cluster_factory(num_shards=2, dim=8, checkpoint_dir=str(tmp_path))
        got = dst.client().load([name], [saved["bytes"]], [saved["checksum"]])
        assert sum(r["rows"] for r in got) == 60_000
        same_rows(sorted_dump([dst.client()]), sorted_dump([disk.client()]))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shards", [1, 2])
def test_a_restore_with_big_blocks_gives_back_every_row(cluster_factory, tmp_path, shards):
    # 2.5M rows on one shard: ~610 rows per partition block, so blocks are inserted by two
    # threads; into 2 shards each reads every other block (chunks of non-adjacent blocks).
    n, dim = 2_500_000, 4
    src = cluster_factory(num_shards=1, dim=dim, checkpoint_dir=str(tmp_path))
    fill(src.client(), n, dim)
    want = sorted_dump([src.client()])
    saved = src.client().save(["big.bin"], 5)[0]
    assert saved["rows"] == n
    src.stop()
    dst = cluster_factory(num_shards=shards, dim=dim, checkpoint_dir=str(tmp_path))
    got = dst.client().load(["big.bin"], [saved["bytes"]], [saved["checksum"]])
    assert sum(r["rows"] for r in got) == n
    same_rows(sorted_dump([dst.client(timeout_s=60.0)]), want)


@pytest.mark.timeout(300)
def test_a_tiered_restore_with_big_blocks_gives_back_every_row(cluster_factory, tmp_path):
    n, dim = 2_200_000, 4  # ~537 rows per block: two inserting threads
    src = cluster_factory(num_shards=1, dim=dim, checkpoint_dir=str(tmp_path))
    fill(src.client(), n, dim)
    want = sorted_dump([src.client()])
    saved = src.client().save(["big.bin"], 5)[0]
    src.stop()
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    dst = cluster_factory(
        num_shards=1,
        dim=dim,
        checkpoint_dir=str(tmp_path),
        memory_rows=100_000,
        ssd_dir=str(ssd),
        max_blocks_per_stripe=65536,
    )
    dst.client().load(["big.bin"], [saved["bytes"]], [saved["checksum"]])
    st = dst.servers[0].stats()
    assert st["rows_dram"] <= 100_000 and st["rows_dram"] + st["rows_ssd"] == n
    same_rows(sorted_dump([dst.client()]), want)
    resaved = dst.client().save(["again.bin"], 5)[0]  # both tiers merged back, same file
    assert (tmp_path / "again.bin").read_bytes() == (tmp_path / "big.bin").read_bytes()
    assert resaved == saved
