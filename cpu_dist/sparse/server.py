"""Run one parameter-server shard as a process.

    python -m cpu_dist.sparse.server --port 0 --dim 64 --token-file /path/to/token

Prints exactly ``listening on HOST:PORT`` (flushed) once it accepts calls, and exits 0 after
SIGTERM/SIGINT or the Shutdown RPC, in both cases after draining in-flight calls.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from cpu_dist.common.config import JobConfig
from cpu_dist.common.contracts import default_init_scale
from cpu_dist.common.tokens import TokenError, read_token_file

from ._ps import Server


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m cpu_dist.sparse.server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--port", type=int, required=True, help="TCP port, 0 = chosen by the OS")
    ap.add_argument("--dim", type=int, required=True, help="row dimension")
    ap.add_argument("--token-file", required=True, help="file holding the job token")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on")
    ap.add_argument("--table", default="embedding")
    ap.add_argument("--seed", type=int, default=0, help="row initialisation seed")
    ap.add_argument(
        "--init-scale",
        type=float,
        default=None,
        help="first-touch rows are uniform in [-scale, scale) (default 1/sqrt(dim), as "
        "launcher.py's)",
    )
    ap.add_argument("--shard-index", type=int, default=0)
    ap.add_argument("--num-shards", type=int, default=1)
    ap.add_argument("--max-message-mb", type=int, default=64)
    ap.add_argument(
        "--checkpoint-dir",
        default="",
        help="Save/Load RPCs read and write files under this directory only (default: refused)",
    )
    ap.add_argument(
        "--session-idle-timeout",
        type=float,
        default=JobConfig.session_idle_timeout_s,
        help="close commit sessions idle this many seconds, e.g. a crashed job's (0: never)",
    )
    ap.add_argument(
        "--ps-memory-rows",
        type=int,
        default=0,
        help="rows this shard keeps in DRAM (0: unbounded); beyond it rows go to --ps-ssd-dir, "
        "or without one the update that needs more is refused",
    )
    ap.add_argument(
        "--ps-ssd-dir",
        default="",
        help="SSD tier: the shard keeps the rows beyond --ps-memory-rows in a RocksDB it "
        "creates in this directory and removes when it stops (working storage, not a checkpoint)",
    )
    ap.add_argument(
        "--ps-admit-after",
        type=int,
        default=0,
        help="a key's gradients are applied from the N-th committed step that contains it "
        "(0 or 1: at once); Push is not subject to it",
    )
    ap.add_argument(
        "--ps-expire-after",
        type=int,
        default=0,
        help="rows not updated by a commit for S steps are dropped (0: never)",
    )
    ap.add_argument(
        "--drain-timeout",
        type=float,
        default=10.0,
        help="seconds to let in-flight calls finish when stopping",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        token = read_token_file(args.token_file)
    except TokenError as e:
        raise SystemExit(f"error: {e}") from None
    stop_requested = []

    def on_signal(signum, _frame):  # runs in the main thread, between wait() slices
        stop_requested.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    srv = Server(
        args.dim,
        token,
        init_scale=args.init_scale if args.init_scale is not None else default_init_scale(args.dim),
        host=args.host,
        port=args.port,
        table=args.table,
        seed=args.seed,
        shard_index=args.shard_index,
        num_shards=args.num_shards,
        max_message_bytes=args.max_message_mb << 20,
        checkpoint_dir=str(Path(args.checkpoint_dir).resolve()) if args.checkpoint_dir else "",
        session_idle_timeout_s=args.session_idle_timeout,
        memory_rows=args.ps_memory_rows,
        ssd_dir=str(Path(args.ps_ssd_dir).resolve()) if args.ps_ssd_dir else "",
        admit_after=args.ps_admit_after,
        expire_after=args.ps_expire_after,
    )
    srv.start()
    print(f"listening on {srv.address}", flush=True)
    while not srv.wait(0.2):
        if stop_requested:
            srv.stop(args.drain_timeout)
    srv.stop(args.drain_timeout)  # joins the drain thread when the Shutdown RPC stopped us
    return 0


if __name__ == "__main__":
    sys.exit(main())
