"""Standalone PS shards (``python -m cpu_dist.sparse.server``) as tests and benchmarks start
them: real processes, each printing ``listening on HOST:PORT`` once it serves, stopped with
SIGTERM (and killed if that does not end them) when the block ends.

One place builds the command and reads the first line, so a change of the server's command
line or of its start-up line is made once, not in every test that needs a shard."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, TypedDict

if TYPE_CHECKING:  # Python 3.11's; annotations are not evaluated at run time
    from typing import Unpack

Launch = Callable[[list[str]], subprocess.Popen]
START_TIMEOUT_S = 60.0  # a shard serves within a second here; a loaded machine gets room


class Placement(TypedDict, total=False):
    """Which shard of how many, where, with which further server flags (default: shard 0 of
    1 on loopback, a port the OS picks, no further flags)."""

    index: int
    count: int
    host: str
    port: int
    extra: Sequence[str]


def shard_argv(token_file: str, dim: int, **where: Unpack[Placement]) -> list[str]:
    return [
        *(sys.executable, "-m", "cpu_dist.sparse.server"),
        *("--host", where.get("host", "127.0.0.1"), "--port", str(where.get("port", 0))),
        *("--dim", str(dim), "--token-file", token_file),
        *("--shard-index", str(where.get("index", 0)), "--num-shards", str(where.get("count", 1))),
        *where.get("extra", ()),
    ]


def _local(argv: list[str]) -> subprocess.Popen:
    # Its own session: a test's kill of the shard (or of its process group) touches nothing else.
    return subprocess.Popen(
        argv,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(proc: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """SIGTERM, then SIGKILL after ``timeout_s``; the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(timeout_s)


def _forward(stream: IO[str]) -> None:
    """Copy a running shard's standard error to ours (a full pipe would stall the shard)."""
    for line in stream:
        sys.stderr.write(line)


def _first_line(proc: subprocess.Popen, timeout_s: float) -> str:
    out = proc.stdout
    assert out is not None, "start shards with stdout=PIPE"
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(out.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return got[0] if got else ""


def start_shard(
    token_file: str,
    dim: int,
    *,
    launch: Launch | None = None,
    timeout_s: float = START_TIMEOUT_S,
    **where: Unpack[Placement],
) -> tuple[subprocess.Popen, str]:
    """One shard, serving: ``(process, "host:port")``.  The caller stops it (:func:`stop`).
    A shard that exits or stays silent for ``timeout_s`` is stopped and RuntimeError names
    its exit code and the last of its standard error."""
    argv = shard_argv(token_file, dim, **where)
    proc = (launch or _local)(argv)
    line = _first_line(proc, timeout_s)
    if not line.startswith("listening on "):
        code = stop(proc, 10.0)
        err = proc.stderr.read().strip() if proc.stderr else ""
        raise RuntimeError(
            f"shard {where.get('index', 0)} did not start (exit {code}): first line {line!r}"
            + (f", stderr: {err[-2000:]}" if err else "")
        )
    if proc.stderr is not None:
        threading.Thread(target=_forward, args=(proc.stderr,), daemon=True).start()
    return proc, line.split()[-1]


@contextlib.contextmanager
def standalone_shard(
    token_file: str, dim: int, *, launch: Launch | None = None, **where: Unpack[Placement]
) -> Iterator[tuple[str, subprocess.Popen]]:
    """One shard for the block (:func:`start_shard`'s keywords): ``(address, process)``.
    A test that asserts how it exits calls :func:`stop` itself inside the block."""
    proc, address = start_shard(token_file, dim, launch=launch, **where)
    try:
        yield address, proc
    finally:
        stop(proc)


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
            proc, address = start_shard(
                token_file,
                dim,
                index=i,
                count=count,
                host=hosts[i] if hosts else "127.0.0.1",
                extra=extra,
                launch=launch[i] if isinstance(launch, Sequence) else launch,
            )
            procs.append(proc)
            addresses.append(address)
        yield addresses, procs
    finally:
        for p in procs:
            stop(p)
