"""Run one parameter-server shard as a process.

    python -m cpu_dist.sparse.server --port 0 --dim 64 --token-file /path/to/token

Prints exactly ``listening on HOST:PORT`` (flushed) once it accepts calls, and exits 0 after
SIGTERM/SIGINT or the Shutdown RPC, in both cases after draining in-flight calls.  A bad
argument, or a shard that cannot start (its port already in use, an address it cannot bind),
is one line ``error: ...`` on standard error and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cpu_dist.common.config import JobConfig, TrainConfig
from cpu_dist.common.contracts import default_init_scale
from cpu_dist.common.flags import add_table_flags
from cpu_dist.common.tokens import TokenError, read_token_file

from ._ps import Server

PROG = "python -m cpu_dist.sparse.server"


def _number(kind: Callable[[str], float], low: float, high: float, what: str):
    """An argparse type: ``kind`` in ``[low, high]`` (finite), else argparse's one-line error."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse


_PORT = _number(int, 0, 65535, "a port in 0..65535")
_POSITIVE_INT = _number(int, 1, 2**32 - 1, "a whole number >= 1")
_INDEX = _number(int, 0, 2**32 - 1, "a whole number >= 0")
_SEED = _number(int, 0, 2**64 - 1, "a seed in 0..2**64-1")
_POSITIVE = _number(float, math.ulp(0.0), math.inf, "a positive number")
_SECONDS = _number(float, 0.0, math.inf, "a number of seconds >= 0")


# The shard's own flags that set a Server keyword as they are: flag, keyword, type, default,
# help.  --port, --dim and --token-file are required; --init-scale, --max-message-mb and
# --checkpoint-dir are converted (make_server); the table flags are the launcher's.
_DIRECT = (
    ("--port", "port", _PORT, None, "TCP port, 0 = chosen by the OS"),
    ("--host", "host", str, "127.0.0.1", "address to listen on"),
    ("--table", "table", str, "embedding", "table name the job's calls must name"),
    ("--seed", "seed", _SEED, TrainConfig.seed, "row initialisation seed"),
    ("--shard-index", "shard_index", _INDEX, 0, "this shard's place in --ps_list"),
    ("--num-shards", "num_shards", _POSITIVE_INT, 1, "length of --ps_list"),
    (
        "--session-idle-timeout",
        "session_idle_timeout_s",
        _SECONDS,
        JobConfig.session_idle_timeout_s,
        "close commit sessions idle this many seconds, e.g. a crashed job's (0: never)",
    ),
)
# The launcher's table flags (flags.add_table_flags: plain ints, which its validate step
# checks): their dest, the Server keyword they set and the largest value that keyword holds.
_TABLE = (
    ("ps_memory_rows", "memory_rows", 2**64 - 1),
    ("ps_memory_bytes", "memory_bytes", 2**64 - 1),
    ("ps_admit_after", "admit_after", 2**32 - 1),
    ("ps_expire_after", "expire_after", 2**32 - 1),
)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG,
        usage="%(prog)s --port P --dim D --token-file F [options]",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s = ap.add_argument_group("shard")
    for flag, _, kind, default, text in _DIRECT:
        s.add_argument(flag, type=kind, default=default, required=default is None, help=text)
    s.add_argument("--dim", type=_POSITIVE_INT, required=True, help="row dimension")
    s.add_argument("--token-file", required=True, help="file holding the job token")
    s.add_argument(
        "--init-scale",
        type=_POSITIVE,
        default=None,
        help="first-touch rows are uniform in [-scale, scale) (default 1/sqrt(dim), as "
        "launcher.py's)",
    )
    s.add_argument(
        "--max-message-mb",
        type=_number(int, 1, 2047, "a number of MiB in 1..2047"),
        default=64,
        help="largest gRPC message the shard accepts, MiB",
    )
    s.add_argument(
        "--checkpoint-dir",
        default="",
        help="Save/Load RPCs read and write files under this directory only (default: refused)",
    )
    s.add_argument(
        "--drain-timeout",
        type=_SECONDS,
        default=10.0,
        help="seconds to let in-flight calls finish when stopping",
    )
    add_table_flags(ap, "table (the launcher's flags of its PS ranks; a job checks they agree)")
    ap.add_argument(
        "--ps-memory-bytes",
        type=int,
        default=0,
        metavar="BYTES",
        help="DRAM this shard keeps for rows, across all its tables (csrc/memory_budget.h; "
        "0: no bound); beyond it rows go to --ps-ssd-dir, which it needs",
    )
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    for dest, _, high in _TABLE:
        value, flag = getattr(args, dest), "--" + dest.replace("_", "-")
        if value < 0 or value > high:
            ap.error(f"argument {flag}: {value} must be " + (">= 0" if value < 0 else f"<= {high}"))
    if args.shard_index >= args.num_shards:
        ap.error(f"--shard-index {args.shard_index} must be below --num-shards {args.num_shards}")
    return args


def _absolute(path: str | None) -> str:
    return str(Path(path).resolve()) if path else ""


def make_server(args: argparse.Namespace, token: str) -> Server:
    """The shard the arguments describe; ValueError when the native module refuses them."""
    given: dict[str, Any] = {
        kw: getattr(args, flag[2:].replace("-", "_")) for flag, kw, *_ in _DIRECT
    }
    given.update({kw: getattr(args, dest) for dest, kw, _ in _TABLE})
    scale = args.init_scale if args.init_scale is not None else default_init_scale(args.dim)
    return Server(
        args.dim,
        token,
        init_scale=scale,
        max_message_bytes=args.max_message_mb << 20,
        checkpoint_dir=_absolute(args.checkpoint_dir),
        ssd_dir=_absolute(args.ps_ssd_dir),
        **given,
    )


@contextlib.contextmanager
def _stderr_held() -> Iterator[list[str]]:
    """File descriptor 2 into a scratch file for the block: a bind that fails makes gRPC log
    its own multi-line error there, and the one line ``error: ...`` says it all (with the
    reason).  The list yielded holds what was written, once the block is over."""
    said: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile("w+") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield said
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            said.append(held.read())


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        token = read_token_file(args.token_file)
    except TokenError as e:
        return _fail(str(e))
    stop_requested = []

    def on_signal(signum, _frame):  # runs in the main thread, between wait() slices
        stop_requested.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        srv = make_server(args, token)
    except (ValueError, TypeError) as e:  # what only the shard's own checks know
        build_parser().error(str(e).splitlines()[0])
    failure = None
    with _stderr_held() as grpc_said:
        try:
            srv.start()
        except RuntimeError as e:  # e.g. the port is in use: Server.start() names host:port
            failure = str(e)
    if failure is not None:
        return _fail(failure)
    sys.stderr.write("".join(grpc_said))  # what gRPC said while starting, when it did start
    print(f"listening on {srv.address}", flush=True)
    while not srv.wait(0.2):
        if stop_requested:
            srv.stop(args.drain_timeout)
    srv.stop(args.drain_timeout)  # joins the drain thread when the Shutdown RPC stopped us
    return 0


if __name__ == "__main__":
    sys.exit(main())
