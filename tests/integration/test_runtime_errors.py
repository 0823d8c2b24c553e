"""Expected failures after the flags were parsed end the job the way a bad flag does: one
``launcher.py: error:`` line naming the cause, exit code 2, and no traceback unless
``CPU_DIST_TRACEBACK=1`` asks for one.  Real mpirun jobs, real shard processes."""

from __future__ import annotations

import socket
import subprocess

import pytest

from cpu_dist.common.tokens import write_token_file
from cpu_dist.testing.shards import standalone_shards

from .launch import SMALL, mpirun

pytestmark = pytest.mark.timeout(300)
DIM = 8  # SMALL's embedding dim


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("launcher.py: error:")]


def assert_one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, exactly one error line holding every needle, no traceback."""
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    lines = error_lines(proc)
    assert len(lines) == 1, proc.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unreachable_job(token: str, address: str):
    """A one-worker job on a --ps_list address where nothing listens."""
    args = ["--worker-num", "1", *SMALL, "--ps_list", address, "--token-file", token]
    return mpirun(1, [*args, "--rpc-timeout", "3"], timeout=120)


def test_an_unreachable_shard_is_one_line_naming_it(token):
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    proc = unreachable_job(token, address)
    assert_one_line(proc, "shard 0", address, "UNAVAILABLE")


def test_a_wrong_token_is_one_line_naming_the_shard(token, tmp_path):
    other = str(tmp_path / "other")
    write_token_file(other, "not-the-shards-secret")
    with standalone_shards(token, DIM, 1) as (addrs, _):
        proc = mpirun(
            1,
            ["--worker-num", "1", *SMALL, "--ps_list", addrs[0], "--token-file", other],
            timeout=120,
        )
    assert_one_line(proc, "shard 0", addrs[0], "token")


def test_a_resume_setting_mismatch_is_one_line(tmp_path):
    d = tmp_path / "ck"
    ck = ["--checkpoint-dir", str(d), "--checkpoint-every", "2"]
    first = mpirun(2, ["--worker-num", "1", *SMALL, "--max_step", "2", *ck], timeout=120)
    assert first.returncode == 0, first.stderr[-3000:]
    proc = mpirun(
        2,
        ["--worker-num", "1", *SMALL, "--max_step", "4", "--resume", *ck, "--batch-size", "48"],
        timeout=120,
    )
    assert_one_line(proc, "--batch-size 96 in the checkpoint, 48 in this job")


def test_corrupt_data_is_one_line_naming_file_and_line(tmp_path):
    good = "\t".join(["1"] + ["3"] * 13 + ["a1b2c3d4"] * 26)
    lines = [good] * 400
    lines[250] = "not\ta\tcriteo\tline"  # read at step 2 (batch 96)
    data = tmp_path / "day.tsv"
    data.write_text("\n".join(lines) + "\n")
    proc = mpirun(
        2,
        [
            "--worker-num",
            "1",
            *SMALL,
            "--max_step",
            "3",
            "--data",
            "criteo",
            "--data-path",
            str(data),
        ],
        timeout=120,
    )
    assert_one_line(proc, f"{data}:251")


def test_a_bad_interface_is_one_line(tmp_path):
    proc = mpirun(2, ["--worker-num", "1", *SMALL, "--ps-interface", "nosuch0"], timeout=120)
    assert_one_line(proc, "--ps-interface nosuch0")


def test_the_traceback_comes_with_the_switch(token):
    import os

    address = f"127.0.0.1:{free_port()}"
    os.environ["CPU_DIST_TRACEBACK"] = "1"
    try:
        proc = unreachable_job(token, address)
    finally:
        del os.environ["CPU_DIST_TRACEBACK"]
    assert proc.returncode == 2 and len(error_lines(proc)) == 1, proc.stderr[-3000:]
    assert "Traceback" in proc.stderr


def test_an_allocation_far_beyond_memory_is_one_line(tmp_path):
    # a cache of 10^11 units of 64 rows: torch's allocator refuses the 2 * 10^14 bytes
    proc = mpirun(
        2,
        [
            "--worker-num",
            "1",
            *SMALL,
            "--read-mode",
            "bagpipe",
            "--optimization-cache-capacity",
            "100000000000",
        ],
        timeout=120,
    )
    assert_one_line(proc, "can't allocate memory")


def test_a_shard_that_cannot_start_is_one_line_naming_its_rank():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        proc = mpirun(2, ["--worker-num", "1", *SMALL, "--ps_list", address], timeout=120)
    assert_one_line(proc, "PS shard failed to start", "rank 1", address)


def test_rdma_off_loopback_is_one_line():
    proc = mpirun(
        2, ["--worker-num", "1", *SMALL, "--ps-type", "RDMA", "--ps-host", "127.0.0.2"], timeout=120
    )
    assert_one_line(proc, "--ps-type RDMA: no RDMA transport exists yet")
