"""`python -m cpu_dist.sparse.server` as a real process: starts, serves, stops cleanly; a bad
argument or a shard that cannot start is one line and exit code 2, never a traceback."""

import contextlib
import socket
import subprocess
import sys

import numpy as np
import pytest

from cpu_dist.common import contracts
from cpu_dist.common.flags import build_parser as launcher_parser
from cpu_dist.common.tokens import write_token_file
from cpu_dist.sparse import Client
from cpu_dist.sparse.server import build_parser as server_parser
from cpu_dist.testing.shards import standalone_shard, stop

TOKEN = "proc-token"
TABLE_FLAGS = ("--ps-memory-rows", "--ps-ssd-dir", "--ps-admit-after", "--ps-expire-after")


def token_file(tmp_path) -> str:
    tf = tmp_path / "token"
    write_token_file(str(tf), TOKEN)
    return str(tf)


@contextlib.contextmanager
def running(tmp_path):
    """A server process and a client of it; stopped if the test leaves it running."""
    extra = ["--seed", "3", "--init-scale", "0.2"]
    with standalone_shard(token_file(tmp_path), 8, extra=extra) as (addr, p):
        assert addr.startswith("127.0.0.1:"), addr
        yield p, Client([addr], TOKEN, 8, timeout_s=10)


def server(args, timeout=30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cpu_dist.sparse.server", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.timeout(60)
def test_sigterm_exits_zero(tmp_path):
    with running(tmp_path) as (p, cl):
        keys = np.array([1, 2, 3], dtype=np.int64)
        assert np.array_equal(cl.pull(keys), contracts.row_init(3, keys, 8, 0.2))
        assert stop(p) == 0


@pytest.mark.timeout(60)
def test_shutdown_rpc_exits_zero(tmp_path):
    with running(tmp_path) as (p, cl):
        cl.push(np.array([5], dtype=np.int64), np.ones((1, 8), np.float32), 0.1)
        cl.shutdown()
        assert p.wait(30) == 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("content", [None, ""])
def test_missing_or_empty_token_file(tmp_path, content):
    tf = tmp_path / "token"
    if content is not None:
        tf.write_text(content)
    r = server(["--port", "0", "--dim", "8", "--token-file", str(tf)])
    assert r.returncode == 2
    assert "--token-file" in r.stderr and ("empty" in r.stderr or "cannot read" in r.stderr)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "args,names",
    [
        (["--dim", "-4"], "--dim"),
        (["--port", "70000"], "--port"),
        (["--shard-index", "2", "--num-shards", "2"], "--shard-index"),
        (["--init-scale", "0"], "--init-scale"),
        (["--ps-memory-rows", "-1"], "--ps-memory-rows"),
        (["--ps-expire-after", str(2**40)], "--ps-expire-after"),
        (["--session-idle-timeout", "nan"], "--session-idle-timeout"),
        (["--ps-ssd-dir", "/tmp/ssd"], "--ps-memory-rows"),  # the shard's own check
    ],
)
def test_a_bad_argument_is_one_argparse_error(tmp_path, args, names):
    base = {"--port": "0", "--dim": "8", "--token-file": token_file(tmp_path)}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    r = server([x for kv in base.items() for x in kv])
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("python -m cpu_dist.sparse.server: error: ") and names in last, last
    assert len(r.stderr.strip().splitlines()) == 2, r.stderr  # usage, then the error


@pytest.mark.timeout(60)
def test_a_port_in_use_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = server(["--port", str(port), "--dim", "8", "--token-file", token_file(tmp_path)])
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""  # never "listening on"
    assert r.stderr.startswith(f"error: could not listen on 127.0.0.1:{port}"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr  # not gRPC's own log lines


def test_the_table_flags_are_the_launchers():
    """One definition: the server's table flags are the launcher's, with its defaults and
    help; and --help documents every flag, the server's own ones included."""

    def actions(parser):
        return {a.option_strings[0]: a for a in parser._actions if a.option_strings}

    ours, launcher = actions(server_parser()), actions(launcher_parser())
    for flag in TABLE_FLAGS:
        a, b = ours[flag], launcher[flag]
        assert (a.dest, a.default, a.type, a.help, a.metavar) == (
            b.dest,
            b.default,
            b.type,
            b.help,
            b.metavar,
        ), flag
    text = server(["--help"]).stdout
    for flag, action in ours.items():
        assert flag in text and (action.help or flag == "-h"), flag
    for own in ("--port", "--dim", "--token-file", "--host", "--drain-timeout"):
        assert own in ours


@pytest.mark.timeout(60)
def test_a_shard_that_does_not_start_says_why(tmp_path):
    """cpu_dist.testing's start-up: the exit code and the server's own error, not a hang."""
    with pytest.raises(RuntimeError, match=r"shard 0 did not start \(exit 2\).*--dim"):
        with standalone_shard(token_file(tmp_path), -4):
            pass
