"""--ps_list both ways the first design used it, with real processes.

1. No PS ranks in the job: workers train against a shard started on its own
   (python -m cpu_dist.sparse.server) and the model still equals the reference.
2. PS ranks in the job: PS rank i listens on the i-th --ps_list address.
"""

from __future__ import annotations

import socket

import pytest

from cpu_dist.common.tokens import write_token_file
from cpu_dist.testing.shards import standalone_shard, stop

from .launch import SMALL, assert_dumps_close, load_dump, mpirun
from .test_equivalence import reference

pytestmark = pytest.mark.timeout(300)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_workers_use_shards_started_elsewhere(tmp_path):
    token = tmp_path / "token"
    write_token_file(str(token), "external-secret")
    extra = ["--seed", "0", "--init-scale", str(8**-0.5)]
    with standalone_shard(str(token), 8, extra=extra) as (address, server):
        out = tmp_path / "ext.npz"
        proc = mpirun(
            2,
            [
                "--worker-num",
                "2",
                "--ps_list",
                address,
                "--token-file",
                str(token),
                *SMALL,
                "--dump-state",
                str(out),
            ],
        )
        assert proc.returncode == 0, proc.stderr
        assert server.poll() is None  # the job leaves shards it did not start running
        assert_dumps_close(load_dump(out), reference("sgd"), 1e-5, "--ps_list shards")
        # A job with the wrong token is refused by the shard, and says which shard refused it.
        bad = tmp_path / "bad"
        write_token_file(str(bad), "wrong")
        proc = mpirun(
            1, ["--worker-num", "1", "--ps_list", address, "--token-file", str(bad), *SMALL]
        )
        assert proc.returncode != 0
        assert "UNAUTHENTICATED" in proc.stderr and address in proc.stderr
        assert stop(server) == 0


def test_ps_ranks_listen_on_the_given_addresses(tmp_path):
    ports = [free_port(), free_port()]
    ps_list = ",".join(f"127.0.0.1:{p}" for p in ports)
    out = tmp_path / "given.npz"
    proc = mpirun(
        3,
        [
            "--worker-num",
            "1",
            "--ps_list",
            ps_list,
            *SMALL,
            "--metrics-out",
            str(tmp_path / "m.jsonl"),
            "--dump-state",
            str(out),
        ],
    )
    assert proc.returncode == 0, proc.stderr
    assert out.exists()
    # A port already taken fails the start on every rank, naming the PS rank and the address.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        proc = mpirun(2, ["--worker-num", "1", "--ps_list", f"127.0.0.1:{busy}", *SMALL])
    assert proc.returncode != 0
    assert f"127.0.0.1:{busy}" in proc.stderr and "rank 1" in proc.stderr


def test_ps_ranks_create_the_tables_of_the_example_job_file(tmp_path):
    """The 26-table Criteo example trains with PS ranks; every table is on the shards with its
    width, and the summary's tables object adds up to the shards' total rows."""
    from cpu_dist.common.features import CATEGORICAL_FEATURES
    from cpu_dist.train.metrics import read_summary

    from .launch import ROOT, with_flags

    example = ROOT / "cpu_dist" / "examples" / "criteo_tables.toml"
    flags = with_flags(
        SMALL, {"--embedding-dim": None, "--arch-mlp-bot": "16-64", "--max_step": "3"}
    )
    metrics = tmp_path / "m.jsonl"
    proc = mpirun(
        4,
        [
            *("--worker-num", "2", "--config", str(example), *flags),
            *("--metrics-out", str(metrics)),
        ],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = read_summary(metrics)
    tables = summary["tables"]
    assert sorted(tables) == sorted(CATEGORICAL_FEATURES)
    assert {t["dim"] for t in tables.values()} == {64}
    assert all(t["rows"] > 0 for t in tables.values())
    assert sum(t["rows"] for t in tables.values()) == summary["ps_rows"]
