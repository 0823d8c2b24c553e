#!/usr/bin/env python
"""Benchmark the C++ parameter server against torch.distributed.rpc over loopback.

One PS process (``python -m cpu_dist.sparse.server``, a subprocess of ours) serves a D=64
table; the same pulls and pushes go to a torch.distributed.rpc worker pair, where a remote
function gathers / applies the same rows on a torch table.  Cases: 256 and 4096 keys per
request, 1 and 4 caller threads.  Then a fresh PS gets 10 million rows via push and its
resident memory per row is reported relative to the payload (D * 4 bytes).

The multi-table case: a shard holding the 26 tables of ``cpu_dist/examples/criteo_tables.toml``
(their widths, Criteo Kaggle's cardinalities capped at ``--multi-table-cap`` rows so that the
tables fit this machine, every row stored) and one table of the same rows; one training step's
pull of all 26 tables (``Client.pull_tables``, one request per shard) is timed against the same
number of rows, of the same widths, pulled from the one table (``Client.pull``).

The last line printed is one JSON object: rows/s per case, ratios (ours / torch rpc),
``ps_bytes_per_row`` and ``multi_table_pull_ratio`` (time of the 26-table pull / time of the
one-table pull).  Targets: pull_ratio_256 >= 3, pull_ratio_4096 >= 1.5,
ps_bytes_per_row <= 1.3, multi_table_pull_ratio <= 1.15.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

import numpy as np

DIM = 64
TABLE_ROWS = 200_000
TOKEN = "bench-token"
TABLES_FILE = Path(__file__).resolve().parent.parent / "cpu_dist/examples/criteo_tables.toml"


# ---- torch.distributed.rpc side (functions must be importable by the worker) ------------

_TABLE = None


def _torch_table():
    global _TABLE
    if _TABLE is None:
        import torch

        _TABLE = torch.randn(TABLE_ROWS, DIM) * 0.01
    return _TABLE


def torch_gather(keys):
    return _torch_table().index_select(0, keys)


def torch_apply(keys, grads, lr):
    import torch

    uniq, inv = torch.unique(keys, return_inverse=True)
    summed = torch.zeros(uniq.numel(), DIM).index_add_(0, inv, grads)
    _torch_table().index_add_(0, uniq, summed, alpha=-lr)
    return int(uniq.numel())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_rpc(rank: int, port: int, transport: str):
    import torch.distributed.rpc as rpc

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    kw = {}
    if transport == "tcp":
        # TCP over loopback, as between hosts and as our PS runs.  TensorPipe's default
        # would pick shared memory / cross-memory-attach between two local processes.
        kw = {"_transports": ["uv"], "_channels": ["basic"]}
    opts = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=8, init_method=f"tcp://127.0.0.1:{port}", **kw
    )
    rpc.init_rpc(
        "ps" if rank == 1 else "trainer", rank=rank, world_size=2, rpc_backend_options=opts
    )
    return rpc


def torch_worker_main(port: int, transport: str) -> None:
    rpc = _init_rpc(1, port, transport)
    _torch_table()
    rpc.shutdown()  # blocks until the trainer is done


# ---- measurement ----------------------------------------------------------------------


def rate(fn_per_thread, threads: int, seconds: float, rows_per_call: int) -> float:
    """rows/s of `threads` callers each running fn(i) in a loop for `seconds`."""
    stop = time.perf_counter() + seconds
    counts = [0] * threads

    def loop(t):
        fn = fn_per_thread(t)
        fn()  # warm-up
        n = 0
        while time.perf_counter() < stop:
            fn()
            n += 1
        counts[t] = n

    start = time.perf_counter()
    ts = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) * rows_per_call / (time.perf_counter() - start)


def key_batches(n: int, count: int = 64, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.choice(TABLE_ROWS, n, replace=False).astype(np.int64) for _ in range(count)]


def start_ps(tmp: Path) -> tuple[subprocess.Popen, str]:
    from cpu_dist.common.tokens import write_token_file
    from cpu_dist.testing.shards import start_shard

    tf = tmp / "token"
    write_token_file(str(tf), TOKEN)
    return start_shard(str(tf), DIM)


class Ours:
    """Callers of our PS: one Client per caller thread (as one per worker process)."""

    def __init__(self, addr: str, threads: int):
        from cpu_dist.sparse import Client

        self.clients = [Client([addr], TOKEN, DIM) for _ in range(threads)]
        keys = np.arange(TABLE_ROWS, dtype=np.int64)
        for i in range(0, TABLE_ROWS, 8192):
            k = keys[i : i + 8192]
            # zero gradients: the rows are stored with their first-touch values
            self.clients[0].push(k, np.zeros((k.size, DIM), np.float32), 1.0)

    def pull(self, t, batches, n):
        cl, it, out = self.clients[t], iter(range(1 << 62)), np.empty((n, DIM), np.float32)
        return lambda: cl.pull(batches[next(it) % len(batches)], out=out)

    def push(self, t, batches, grads):
        cl, it = self.clients[t], iter(range(1 << 62))
        return lambda: cl.push(batches[next(it) % len(batches)], grads, 0.01)


class TorchRpc:
    """A torch.distributed.rpc pair: a 'ps' worker holding the table as a torch tensor and a
    'trainer' making the calls.  Both are subprocesses: an RPC agent living in the same
    process as our client halves our 1 MiB pull rate (measured), which would flatter torch."""

    def __init__(self, transport: str):
        port = _free_port()
        self.worker = subprocess.Popen(
            [sys.executable, __file__, "--torch-worker", str(port), transport]
        )
        self.trainer = subprocess.Popen(
            [sys.executable, __file__, "--torch-trainer", str(port), transport],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, kind: str, n: int, threads: int, seconds: float) -> float:
        self.trainer.stdin.write(json.dumps([kind, n, threads, seconds]) + "\n")
        self.trainer.stdin.flush()
        line = self.trainer.stdout.readline()
        if not line:
            raise SystemExit("torch rpc trainer died")
        return float(line)

    def close(self):
        self.trainer.stdin.close()
        self.trainer.wait(60)
        self.worker.wait(60)


def torch_trainer_main(port: int, transport: str) -> None:
    import torch

    rpc = _init_rpc(0, port, transport)
    grads = {}
    for line in sys.stdin:
        kind, n, threads, seconds = json.loads(line)
        tb = [torch.from_numpy(b) for b in key_batches(n)]
        g = grads.setdefault(
            n,
            torch.from_numpy(
                np.random.default_rng(1).standard_normal((n, DIM)).astype(np.float32) * 1e-3
            ),
        )

        def make(t):
            it = iter(range(1 << 62))
            if kind == "pull":
                return lambda: rpc.rpc_sync("ps", torch_gather, args=(tb[next(it) % len(tb)],))
            return lambda: rpc.rpc_sync("ps", torch_apply, args=(tb[next(it) % len(tb)], g, 0.01))

        print(rate(make, threads, seconds, n), flush=True)
    rpc.shutdown()


def bench_pair(systems: dict, sizes, thread_counts, seconds: float, rounds: int) -> dict:
    """Every case runs `rounds` times, alternating systems, so that load from other processes
    on this shared 2-core machine hits both alike; the median round is reported."""
    out = {}
    for n in sizes:
        batches = key_batches(n)
        grads = np.random.default_rng(1).standard_normal((n, DIM)).astype(np.float32) * 1e-3
        for th in thread_counts:
            for kind in ("pull", "push"):
                samples: dict[str, list[float]] = {name: [] for name in systems}
                for _ in range(rounds):
                    for name, sysm in systems.items():
                        if isinstance(sysm, TorchRpc):
                            samples[name].append(sysm.run(kind, n, th, seconds))
                            continue
                        if kind == "pull":
                            make = lambda t, s=sysm: s.pull(t, batches, n)  # noqa: E731
                        else:
                            make = lambda t, s=sysm: s.push(t, batches, grads)  # noqa: E731
                        samples[name].append(rate(make, th, seconds, n))
                for name, vals in samples.items():
                    out[f"{name}_{kind}_{n}_t{th}"] = float(np.median(vals))
    return out


def bench_memory(tmp: Path, rows: int, batch: int = 65536) -> dict:
    from cpu_dist.sparse import Client

    p, addr = start_ps(tmp)
    try:
        cl = Client([addr], TOKEN, DIM, timeout_s=300)
        base = cl.stats()[0]["resident_bytes"]
        rng = np.random.default_rng(2)
        grads = rng.standard_normal((batch, DIM)).astype(np.float32)
        # Scattered int64 keys (a permutation of a sparse id space), inserted via push.
        t0 = time.perf_counter()
        for start in range(0, rows, batch):
            k = np.arange(start, min(rows, start + batch), dtype=np.int64) * 2654435761 + 17
            h = cl.push_async(k, grads[: k.size], 0.01, "rowwise_adagrad")
            h.wait(300)
        insert_s = time.perf_counter() - t0
        st = cl.stats()[0]
        cl.shutdown()
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
    return {
        "mem_rows": st["rows"],
        "ps_resident_bytes": st["resident_bytes"],
        "ps_resident_bytes_at_start": base,
        "ps_table_bytes": st["table_bytes"],
        "ps_insert_rows_per_s": rows / insert_s,
        "ps_bytes_per_row": st["resident_bytes"] / st["rows"] / (DIM * 4),
        "ps_table_bytes_per_row": st["table_bytes"] / st["rows"] / (DIM * 4),
    }


def criteo_tables(cap: int) -> list[tuple[str, int, int]]:
    """(name, dim, rows) of the example's tables, rows = its num_embeddings capped at `cap`."""
    with open(TABLES_FILE, "rb") as f:
        tables = tomllib.load(f)["tables"]
    return [(t["name"], int(t["dim"]), min(int(t["num_embeddings"]) or cap, cap)) for t in tables]


def bench_multi_table(tmp: Path, cap: int, batch: int, seconds: float, rounds: int) -> dict:
    """One step's pull of 26 tables against the same rows from one table of the same width.

    Both tables' rows are stored (pushed with zero gradients) on one shard; each step draws
    `batch` ids per table uniformly below the table's rows, and the one-table step pulls the
    same ids at the tables' offsets in one fused key space (the widths are all DIM, the
    example's).  Rounds alternate the two, and the median round's steps/s are compared."""
    from cpu_dist.common.contracts import default_init_scale
    from cpu_dist.sparse import Client

    tables = criteo_tables(cap)
    widths = {dim for _, dim, _ in tables}
    if widths != {DIM}:
        raise SystemExit(f"{TABLES_FILE}: the one-table comparison needs every dim {DIM}: {widths}")
    p, addr = start_ps(tmp)
    try:
        specs = [
            {
                "name": name,
                "dim": dim,
                "optimizer": "sgd",
                "init_scale": default_init_scale(dim),
                "seed": 0,
                "num_embeddings": rows,
                "admit_after": 0,
                "expire_after": 0,
                "eps": 0.0,
            }
            for name, dim, rows in tables
        ]
        admin = Client([addr], TOKEN, DIM, timeout_s=300)
        admin.create_tables(specs)
        # Both with the client's default --ps-max-keys-per-rpc.
        multi = Client(
            [addr], TOKEN, DIM, tables=[(name, dim) for name, dim, _ in tables], timeout_s=300
        )
        one = Client([addr], TOKEN, DIM, timeout_s=300)
        offsets = np.cumsum([0] + [rows for _, _, rows in tables])
        chunk = 65536
        for (name, dim, rows), off in zip(tables, offsets[:-1]):
            for lo in range(0, rows, chunk):
                k = np.arange(lo, min(rows, lo + chunk), dtype=np.int64)
                zeros = np.zeros((k.size, dim), np.float32)
                multi.push_tables({name: (k, zeros, 1.0)})
                one.push(k + off, zeros, 1.0)
        rng = np.random.default_rng(3)
        steps = []
        for _ in range(16):
            ids = [rng.integers(0, rows, batch).astype(np.int64) for _, _, rows in tables]
            parts = {name: k for (name, _, _), k in zip(tables, ids)}
            fused = np.concatenate([k + off for k, off in zip(ids, offsets[:-1])])
            steps.append((parts, fused))
        rows_per_step = batch * len(tables)
        out_one = np.empty((rows_per_step, DIM), np.float32)

        def multi_step(i: int) -> None:
            multi.pull_tables(steps[i % len(steps)][0])

        def one_step(i: int) -> None:
            one.pull(steps[i % len(steps)][1], out=out_one)

        # Both pull what they should: every table's rows at its width, one table at a time the
        # same (the tables' rows differ from the one table's: each table salts its first-touch
        # rows), so a wrong comparison fails loudly.
        got = multi.pull_tables(steps[0][0])
        for name, dim, _ in tables:
            alone = multi.pull_tables({name: steps[0][0][name]})[name]
            if got[name].shape != (batch, dim) or not np.array_equal(got[name], alone):
                raise SystemExit(f"multi-table bench: table {name}'s rows are wrong")
        one_step(0)
        samples: dict[str, list[float]] = {"multi": [], "one": []}
        for _ in range(rounds):
            for name, fn in (("multi", multi_step), ("one", one_step)):
                samples[name].append(rate(lambda t, f=fn: _stepper(f), 1, seconds, 1))
        admin.shutdown()
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
    multi_rate, one_rate = (float(np.median(samples[k])) for k in ("multi", "one"))
    return {
        "multi_table_tables": len(tables),
        "multi_table_rows": int(offsets[-1]),
        "multi_table_batch": batch,
        "multi_table_pull_steps_per_s": multi_rate,
        "one_table_pull_steps_per_s": one_rate,
        "multi_table_pull_rows_per_s": multi_rate * rows_per_step,
        "multi_table_pull_ratio": one_rate / multi_rate,  # time multi / time one
    }


def _stepper(fn):
    """A loop body for rate(): fn(0), fn(1), ..."""
    it = iter(range(1 << 62))
    return lambda: fn(next(it))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--torch-worker":
        torch_worker_main(int(sys.argv[2]), sys.argv[3])
        return
    if len(sys.argv) == 4 and sys.argv[1] == "--torch-trainer":
        torch_trainer_main(int(sys.argv[2]), sys.argv[3])
        return
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=0.6, help="per case and round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per case")
    ap.add_argument("--mem-rows", type=int, default=10_000_000)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument(
        "--multi-table-cap",
        type=int,
        default=40_000,
        help="rows of each of the 26 tables at most (Criteo Kaggle's cardinalities capped; "
        "0: skip the multi-table case)",
    )
    ap.add_argument("--multi-table-batch", type=int, default=2048, help="ids per table a step")
    ap.add_argument("--multi-table-rounds", type=int, default=5)
    ap.add_argument(
        "--torch-transport",
        choices=["tcp", "default"],
        default="tcp",
        help="tcp: TensorPipe over TCP loopback (uv transport, basic channel), "
        "like our PS; default: TensorPipe's own choice (shared memory)",
    )
    args = ap.parse_args()
    sizes, thread_counts = (256, 4096), (1, 4)
    result: dict = {"dim": DIM}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        p, addr = start_ps(tmp)
        torch_rpc = None
        try:
            systems = {"ours": Ours(addr, max(thread_counts))}
            if not args.skip_torch:
                torch_rpc = TorchRpc(args.torch_transport)
                systems["torch"] = torch_rpc
                result["torch_transport"] = args.torch_transport
            result.update(bench_pair(systems, sizes, thread_counts, args.seconds, args.rounds))
        finally:
            if torch_rpc is not None:
                torch_rpc.close()
            p.terminate()
            p.wait(30)
        if not args.skip_torch:
            for kind in ("pull", "push"):
                for n in sizes:
                    for th in thread_counts:
                        ours, theirs = (
                            result[f"ours_{kind}_{n}_t{th}"],
                            result[f"torch_{kind}_{n}_t{th}"],
                        )
                        suffix = "" if th == 1 else f"_t{th}"
                        result[f"{kind}_ratio_{n}{suffix}"] = ours / theirs
        if args.mem_rows > 0:
            result.update(bench_memory(tmp, args.mem_rows))
        if args.multi_table_cap > 0:
            result.update(
                bench_multi_table(
                    tmp,
                    args.multi_table_cap,
                    args.multi_table_batch,
                    args.seconds,
                    args.multi_table_rounds,
                )
            )
    for k, v in result.items():
        if k not in ("dim", "torch_transport"):
            print(
                f"{k:32s} {v:,.3f}" if isinstance(v, float) else f"{k:32s} {v:,}", file=sys.stderr
            )
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.items()}))


if __name__ == "__main__":
    main()
