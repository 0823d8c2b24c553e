"""Standalone PS shards (``python -m cpu_dist.sparse.server``) as tests and benchmarks start
them: real processes, each printing ``listening on HOST:PORT`` once it serves, stopped with
SIGTERM (and killed if that does not end them) when the block ends."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence

Launch = Callable[[list[str]], subprocess.Popen]


def shard_argv(
    token_file: str,
    dim: int,
    *,
    index: int = 0,
    count: int = 1,
    host: str = "127.0.0.1",
    port: int = 0,
    extra: Sequence[str] = (),
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cpu_dist.sparse.server",
        "--host",
        host,
        "--port",
        str(port),
        "--dim",
        str(dim),
        "--token-file",
        token_file,
        "--shard-index",
        str(index),
        "--num-shards",
        str(count),
        *extra,
    ]


def _local(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """SIGTERM, then SIGKILL after ``timeout_s``; the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(timeout_s)


@contextlib.contextmanager
def standalone_shards(
    token_file: str,
    dim: int,
    count: int = 1,
    *,
    hosts: Sequence[str] | None = None,
    extra: Sequence[str] = (),
    launch: Launch | Sequence[Launch] | None = None,
) -> Iterator[tuple[list[str], list[subprocess.Popen]]]:
    """``count`` shards, shard i of ``count`` listening on ``hosts[i]`` (default loopback);
    ``launch`` starts a process (e.g. inside a network lab's host; one per shard or one for
    all).  Yields ``(addresses, processes)``."""
    procs: list[subprocess.Popen] = []
    addresses = []
    try:
        for i in range(count):
            host = hosts[i] if hosts else "127.0.0.1"
            argv = shard_argv(token_file, dim, index=i, count=count, host=host, extra=extra)
            start = launch[i] if isinstance(launch, Sequence) else (launch or _local)
            proc = start(argv)
            procs.append(proc)
            assert proc.stdout is not None, "start shards with stdout=PIPE"
            line = proc.stdout.readline()
            if not line.startswith("listening on "):
                raise RuntimeError(f"shard {i} did not start (exit {proc.poll()}): {line!r}")
            addresses.append(line.split()[-1])
        yield addresses, procs
    finally:
        for p in procs:
            stop(p)
