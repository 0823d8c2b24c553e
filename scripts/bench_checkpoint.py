#!/usr/bin/env python
"""Checkpoint throughput of PS shards: write (Save RPC: snapshot, partition blocks, crc32,
fsync, rename) and restore (Load RPC: read the owned partitions, check every crc32, rebuild
the table), at --rows rows of --dim floats (default 10 M x 64, about 2.7 GB of file).

    .venv/bin/python scripts/bench_checkpoint.py [--rows N] [--dim D] [--restore-shards P]

The restore reads files the save has just written, so they come from the page cache: the
figure is the shard's own cost (read, check, rebuild), not the disk's.  The last line is one
JSON object with save_gbps and restore_gbps (file bytes per second, 1e9).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from cpu_dist.sparse import Client, Server

TOKEN = "bench"


def fill(client: Client, rows: int, dim: int, chunk: int = 100_000) -> np.ndarray:
    rng = np.random.default_rng(0)
    keys = rng.permutation(rows).astype(np.int64) * 7919 + 13  # spread, unique
    grads = rng.standard_normal((chunk, dim)).astype(np.float32)
    for lo in range(0, rows, chunk):
        part = keys[lo : lo + chunk]
        client.push(part, grads[: len(part)], 0.01, "rowwise_adagrad")
    return keys


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument(
        "--restore-shards",
        type=int,
        default=1,
        help="restore into this many shards (re-partitioning when not 1)",
    )
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(dir=args.dir, prefix="bench_ckpt_")
    root = Path(tmp.name)

    src = Server(args.dim, TOKEN, init_scale=0.01, seed=1, checkpoint_dir=str(root))
    src.start()
    client = Client([src.address], TOKEN, args.dim, timeout_s=120.0)
    t0 = time.perf_counter()
    keys = fill(client, args.rows, args.dim)
    print(f"filled {args.rows:,} rows x {args.dim} in {time.perf_counter() - t0:.1f} s", flush=True)
    sample = keys[:: max(1, args.rows // 20_000)]
    want = client.pull(sample)

    t0 = time.perf_counter()
    res = client.save(["bench/shard-00000-of-00001.bin"], 0)[0]
    save_s = time.perf_counter() - t0
    size = int(res["bytes"])
    print(
        f"save:    {size / 1e9:.2f} GB in {save_s:.2f} s = {size / save_s / 1e9:.2f} GB/s "
        f"({res['rows']:,} rows, fsynced)",
        flush=True,
    )
    src.stop(5.0)
    del client, src  # frees the source table before the restore builds its own

    n = args.restore_shards
    dst = [
        Server(
            args.dim,
            TOKEN,
            init_scale=0.01,
            seed=1,
            shard_index=i,
            num_shards=n,
            checkpoint_dir=str(root),
        )
        for i in range(n)
    ]
    for s in dst:
        s.start()
    client = Client([s.address for s in dst], TOKEN, args.dim, timeout_s=120.0)
    t0 = time.perf_counter()
    loaded = client.load(["bench/shard-00000-of-00001.bin"], [size], [int(res["checksum"])])
    restore_s = time.perf_counter() - t0
    rows = sum(int(r["rows"]) for r in loaded)
    print(
        f"restore: {size / 1e9:.2f} GB in {restore_s:.2f} s = {size / restore_s / 1e9:.2f} GB/s "
        f"({rows:,} rows into {n} shard(s), every crc32 checked)",
        flush=True,
    )
    assert rows == args.rows
    np.testing.assert_array_equal(client.pull(sample), want)
    for s in dst:
        s.stop(5.0)
    print(
        json.dumps(
            {
                "rows": args.rows,
                "dim": args.dim,
                "file_bytes": size,
                "save_s": round(save_s, 3),
                "restore_s": round(restore_s, 3),
                "restore_shards": n,
                "save_gbps": round(size / save_s / 1e9, 3),
                "restore_gbps": round(size / restore_s / 1e9, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
