"""`python -m cpu_dist.sparse.server` as a real process: starts, serves, stops cleanly."""

import contextlib
import subprocess
import sys

import numpy as np
import pytest

from cpu_dist.common import contracts
from cpu_dist.common.tokens import write_token_file
from cpu_dist.sparse import Client


def start(tmp_path, token="proc-token", extra=()):
    tf = tmp_path / "token"
    write_token_file(str(tf), token)
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cpu_dist.sparse.server",
            "--port",
            "0",
            "--dim",
            "8",
            "--token-file",
            str(tf),
            "--seed",
            "3",
            "--init-scale",
            "0.2",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = p.stdout.readline().strip()
    assert line.startswith("listening on 127.0.0.1:"), (line, p.stderr.read() if p.poll() else "")
    return p, line.split()[-1]


@contextlib.contextmanager
def running(tmp_path):
    """A server process and a client of it; killed if the test leaves it running."""
    p, addr = start(tmp_path)
    try:
        yield p, Client([addr], "proc-token", 8, timeout_s=10)
    finally:
        if p.poll() is None:
            p.kill()


@pytest.mark.timeout(60)
def test_sigterm_exits_zero(tmp_path):
    with running(tmp_path) as (p, cl):
        keys = np.array([1, 2, 3], dtype=np.int64)
        assert np.array_equal(cl.pull(keys), contracts.row_init(3, keys, 8, 0.2))
        p.terminate()
        assert p.wait(30) == 0


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
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cpu_dist.sparse.server",
            "--port",
            "0",
            "--dim",
            "8",
            "--token-file",
            str(tf),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode != 0
    assert "--token-file" in r.stderr and ("empty" in r.stderr or "cannot read" in r.stderr)
