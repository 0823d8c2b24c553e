"""Jobs whose parts sit on other hosts: network namespaces of this machine joined by veth
links (cpu_dist/testing/netlab.py).  Real shards, real mpirun, real gRPC across the links;
each job's model must equal the same job on one host bit for bit.  Skipped, with the reason,
only where this machine cannot make network namespaces (a failure instead under
CPU_DIST_REQUIRE=netlab, as .ci/run sets)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cpu_dist.common.launch_env import mpi_env
from cpu_dist.common.tokens import write_token_file
from cpu_dist.testing.netlab import NetLab, mpi_env_for, unavailable
from cpu_dist.testing.shards import standalone_shards

from .launch import ROOT, SMALL, assert_dumps_equal, load_dump, mpirun

REASON = unavailable()
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.netlab,  # under CPU_DIST_REQUIRE=netlab (.ci/run) this skip is a failure
    pytest.mark.skipif(REASON is not None, reason=f"no network lab here: {REASON}"),
]
LAUNCHER = str(ROOT / "launcher.py")


def job_args(out: Path, *extra: str) -> list[str]:
    return [*SMALL, *extra, "--dump-state", str(out)]


def test_standalone_shards_on_other_hosts_train_to_the_same_bits(tmp_path):
    token = str(tmp_path / "token")
    write_token_file(token, "lab-secret")
    ext = ["--token-file", token]
    with NetLab(hosts=2) as lab:
        launches = [
            lambda argv, h=h: lab.popen(h, argv, stdout=subprocess.PIPE, text=True)
            for h in lab.hosts
        ]
        hosts = [h.address for h in lab.hosts]
        with standalone_shards(token, 8, 2, hosts=hosts, launch=launches) as (addrs, _):
            assert all(a.startswith(h + ":") for a, h in zip(addrs, hosts))
            remote = tmp_path / "remote.npz"
            proc = mpirun(
                2, ["--worker-num", "2", "--ps_list", ",".join(addrs), *ext, *job_args(remote)]
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
    with standalone_shards(token, 8, 2) as (addrs, _):
        local = tmp_path / "local.npz"
        proc = mpirun(
            2, ["--worker-num", "2", "--ps_list", ",".join(addrs), *ext, *job_args(local)]
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert_dumps_equal(load_dump(remote), load_dump(local), "external shards on other hosts")


def test_ps_ranks_of_one_job_on_another_host(tmp_path):
    """One mpirun job: two workers here, its PS rank inside a namespace.  The PS rank must
    publish the address the workers reach it at (not loopback, not the host name's 127.0.1.1)
    without --ps-host."""
    remote, local = tmp_path / "remote.npz", tmp_path / "local.npz"
    args = ["--worker-num", "2", *job_args(remote)]
    with NetLab(hosts=1) as lab:
        host = lab.hosts[0]
        env = {**mpi_env(), **mpi_env_for([host.subnet]), "PYTHONUNBUFFERED": "1"}
        cmd = [
            "mpirun",
            "-np",
            "2",
            sys.executable,
            LAUNCHER,
            *args,
            ":",
            "-np",
            "1",
            *lab.command(host, [sys.executable, LAUNCHER, *args]),
        ]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    proc = mpirun(3, ["--worker-num", "2", *job_args(local)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_dumps_equal(load_dump(remote), load_dump(local), "a PS rank on another host")


def test_the_seed_wildcard_ps_list_end_to_end(tmp_path):
    """The first design's command line, ``--ps_list "0.0.0.0:8000,0.0.0.0:8001"``, run inside
    a namespace of its own so that the fixed ports cannot clash with anything here."""
    wild, plain = tmp_path / "wild.npz", tmp_path / "plain.npz"
    args = ["--worker-num", "2", "--ps_list", "0.0.0.0:8000,0.0.0.0:8001", *job_args(wild)]
    with NetLab(hosts=1) as lab:
        cmd = lab.command(lab.hosts[0], ["mpirun", "-np", "4", sys.executable, LAUNCHER, *args])
        env = {**mpi_env(), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, proc.stderr[-3000:]
    proc = mpirun(4, ["--worker-num", "2", *job_args(plain)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_dumps_equal(load_dump(wild), load_dump(plain), "--ps_list 0.0.0.0:8000,...")
