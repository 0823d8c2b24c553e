"""The Slurm batch scripts, run on a real (private, one-node) Slurm cluster.

A module-scoped fixture installs slurm-wlm and munge when missing, starts munged, slurmctld and
slurmd with scripts/slurm/cluster.sh in a temporary folder, and stops them afterwards, also
when a test fails. Jobs are real: sbatch --wait, srun --mpi=pmix, OpenMPI over PMIx, the real
launcher. The module is skipped only when Slurm cannot be installed on this machine at all (a
failure instead under CPU_DIST_REQUIRE=slurm, as .ci/run sets).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from .launch import assert_dumps_equal, load_dump

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "scripts" / "slurm" / "cluster.sh"
TRAIN = ROOT / "scripts" / "slurm" / "train.sbatch"
TEST = ROOT / "scripts" / "slurm" / "test.sbatch"
PY = ROOT / ".venv" / "bin" / "python"
pytestmark = pytest.mark.slurm  # under CPU_DIST_REQUIRE=slurm (.ci/run) a skip is a failure

INSTALL_TIMEOUT_S = 900  # apt-get update + install on a slow mirror
CLUSTER_TIMEOUT_S = 180  # start or stop
SMALL_JOB_TIMEOUT_S = 180
TRAIN_TIMEOUT_S = 900  # a few training steps on 2 busy cores

# A few steps of the default model, small enough for 2 cores; the same flags under sbatch and
# under mpirun.
TRAIN_FLAGS = [
    "--worker-num",
    "2",
    "--max_step",
    "5",
    "--batch-size",
    "256",
    "--seed",
    "7",
    "--no-progress",
]


def _clean_env() -> dict[str, str]:
    """This process's environment without traces of any Slurm job or MPI launch around it.

    The tests may themselves run inside a job (scripts/slurm/test.sbatch on a real cluster);
    its SLURM_*/PMIX_*/OMPI_COMM_WORLD_* variables must not leak into the private cluster.
    """
    drop = ("SLURM_", "PMIX_", "PMI_", "OMPI_COMM_WORLD_", "OMPI_MCA_orte_", "PRTE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        {
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    return env


@dataclass
class Cluster:
    dir: Path
    env: dict[str, str]

    def run(
        self, args: list[str], timeout: float, cwd: Path, extra_env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against the private cluster, bounded by `timeout`.

        On a timeout every job of the private cluster (all of them are this module's) is
        cancelled, so a stuck job cannot outlive the test that started it.
        """
        env = {**self.env, **(extra_env or {})}
        try:
            return subprocess.run(
                args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            subprocess.run(
                ["scancel", "--full", "-u", _user()],
                env=self.env,
                capture_output=True,
                timeout=30,
                check=False,
            )
            pytest.fail(
                f"{' '.join(map(str, args))} did not finish within {timeout} s; "
                f"output so far:\n{exc.stdout or ''}\n{exc.stderr or ''}\n"
                f"{self.daemon_logs()}"
            )

    def sbatch(
        self,
        script: Path,
        sbatch_flags: list[str],
        script_args: list[str],
        workdir: Path,
        timeout: float,
        extra_env: dict[str, str] | None = None,
    ) -> tuple[int, str]:
        """sbatch --wait; returns the job's exit code and its output file's text."""
        out = workdir / f"job-{time.monotonic_ns()}.out"
        proc = self.run(
            ["sbatch", "--wait", "-o", str(out), *sbatch_flags, str(script), *script_args],
            timeout=timeout,
            cwd=workdir,
            extra_env=extra_env,
        )
        text = out.read_text(errors="replace") if out.exists() else ""
        return proc.returncode, f"{text}\n--- sbatch: {proc.stdout}{proc.stderr}"

    def daemon_logs(self) -> str:
        parts = []
        for log in sorted((self.dir / "log").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {log.name} (last lines)\n" + "\n".join(lines))
        return "\n".join(parts)


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _sh(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=_clean_env(),
    )


@pytest.fixture(scope="module")
def cluster():
    try:
        inst = _sh([str(CLUSTER), "install"], INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.skip(
            f"Slurm cannot be installed here: `cluster.sh install` took over {INSTALL_TIMEOUT_S} s"
        )
    if inst.returncode != 0:
        pytest.skip(
            "Slurm cannot be installed here (slurm-wlm/munge missing and "
            f"`scripts/slurm/cluster.sh install` failed):\n{inst.stderr[-2000:]}"
        )
    # A short path: munge's and PMIx's unix sockets live below it (108-byte limit).
    state = Path(tempfile.mkdtemp(prefix="cpu_dist-slurm-"))
    try:
        try:
            start = _sh([str(CLUSTER), "start", str(state)], CLUSTER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"cluster.sh start took over {CLUSTER_TIMEOUT_S} s")
        if start.returncode != 0:
            pytest.fail(f"cluster.sh start failed:\n{start.stdout}\n{start.stderr}")
        env = _clean_env()
        env["SLURM_CONF"] = str(state / "slurm.conf")
        yield Cluster(state, env)
    finally:
        stop = _sh([str(CLUSTER), "stop", str(state)], CLUSTER_TIMEOUT_S)
        shutil.rmtree(state, ignore_errors=True)
        assert stop.returncode == 0, f"cluster.sh stop failed:\n{stop.stderr}"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


# --- the batch scripts, on a stand-in project ------------------------------------------------

STUB_LAUNCHER = """\
import json, os, sys
from cpu_dist.common.slurm import check_launch_environment, check_world_size
try:
    check_launch_environment()          # before MPI_Init, as the real launcher does
except RuntimeError as exc:
    print(f"launcher.py: error: {exc}", file=sys.stderr, flush=True)  # every task, as launcher.py
    sys.exit(2)
from mpi4py import MPI
world = MPI.COMM_WORLD
check_world_size(world.Get_size())
ranks = world.allgather((world.Get_rank(), int(os.environ["SLURM_PROCID"])))
if world.Get_rank() == 0:
    print("STUB " + json.dumps({"size": world.Get_size(), "ranks": ranks, "argv": sys.argv[1:],
                                "cwd": os.getcwd(), "exe": sys.executable}), flush=True)
"""


@pytest.fixture
def stub_project(tmp_path: Path) -> Path:
    """A project tree with the real scripts and .venv but a launcher that reports what it got.

    It checks what the scripts themselves promise (root discovery from a spool copy, argument
    pass-through, one MPI world over PMIx) independently of the training code.
    """
    root = tmp_path / "proj"
    (root / "scripts" / "slurm").mkdir(parents=True)
    for rel in (
        "scripts/env.sh",
        "scripts/slurm/train.sbatch",
        "scripts/slurm/test.sbatch",
        "scripts/slurm/job_env.sh",
    ):
        shutil.copy2(ROOT / rel, root / rel)
    (root / ".venv").symlink_to(ROOT / ".venv")
    (root / "launcher.py").write_text(STUB_LAUNCHER)
    return root


def _stub_report(output: str) -> dict:
    for line in output.splitlines():
        if line.startswith("STUB "):
            return json.loads(line[5:])
    raise AssertionError(f"the stub launcher printed no report:\n{output}")


@pytest.mark.timeout(SMALL_JOB_TIMEOUT_S + 60)
def test_train_script_forms_one_mpi_world_and_passes_arguments(cluster, stub_project, workdir):
    script = stub_project / "scripts" / "slurm" / "train.sbatch"
    args = ["--worker-num", "2", "--data-path", "a file with spaces.tsv", "--max_step", "3"]
    rc, out = cluster.sbatch(script, ["-n", "3", "-O"], args, workdir, SMALL_JOB_TIMEOUT_S)
    assert rc == 0, out + cluster.daemon_logs()
    report = _stub_report(out)
    assert report["size"] == 3
    assert sorted(map(tuple, report["ranks"])) == [(0, 0), (1, 1), (2, 2)]
    assert report["argv"] == args
    assert report["cwd"] == str(workdir)  # relative paths stay relative to submit dir
    assert report["exe"].startswith(str(stub_project / ".venv"))


@pytest.mark.timeout(SMALL_JOB_TIMEOUT_S + 60)
def test_train_script_defaults_worker_num_to_all_tasks_but_one(cluster, stub_project, workdir):
    script = stub_project / "scripts" / "slurm" / "train.sbatch"
    rc, out = cluster.sbatch(
        script, ["-n", "4", "-O"], ["--seed", "3"], workdir, SMALL_JOB_TIMEOUT_S
    )
    assert rc == 0, out
    report = _stub_report(out)
    assert report["size"] == 4 and report["argv"] == ["--worker-num", "3", "--seed", "3"]


@pytest.mark.timeout(SMALL_JOB_TIMEOUT_S + 60)
def test_stub_launcher_reports_srun_without_pmix(cluster, stub_project, workdir):
    script = stub_project / "scripts" / "slurm" / "train.sbatch"
    rc, out = cluster.sbatch(
        script,
        ["-n", "3", "-O"],
        ["--worker-num", "2"],
        workdir,
        SMALL_JOB_TIMEOUT_S,
        extra_env={"SLURM_MPI_TYPE": "none"},
    )
    assert rc != 0, out
    assert "STUB " not in out
    assert "SLURM_NTASKS=3" in out and "srun --mpi=pmix" in out, out


MPI_TESTS = """\
import pytest
from mpi4py import MPI

@pytest.mark.mpi(min_size=3)
def test_allreduce():
    comm = MPI.COMM_WORLD
    assert comm.allreduce(comm.Get_rank() + 1) == comm.Get_size() * (comm.Get_size() + 1) // 2

@pytest.mark.mpi(min_size=2)
def test_fails_on_one_rank_only():
    import os
    assert os.environ.get("FAIL_ON_RANK") != str(MPI.COMM_WORLD.Get_rank())
"""


@pytest.mark.timeout(2 * SMALL_JOB_TIMEOUT_S + 60)
def test_test_script_runs_pytest_mpi_under_srun(cluster, workdir):
    tests = workdir / "test_tiny_mpi.py"
    tests.write_text(MPI_TESTS)
    logs = workdir / "logs"
    env = {"CPU_DIST_LOG_DIR": str(logs)}
    rc, out = cluster.sbatch(
        TEST, ["-n", "3", "-O"], [str(tests)], workdir, SMALL_JOB_TIMEOUT_S, extra_env=env
    )
    assert rc == 0, out
    assert "2 passed" in out
    assert (logs / "pytest.xml").exists() and (logs / "rank2.log").exists()
    assert "2 passed" in (logs / "rank2.log").read_text()

    rc, out = cluster.sbatch(
        TEST,
        ["-n", "3", "-O"],
        [str(tests)],
        workdir,
        SMALL_JOB_TIMEOUT_S,
        extra_env={**env, "FAIL_ON_RANK": "2"},
    )
    assert rc != 0, out
    assert "rank2.log" in out and "test_fails_on_one_rank_only" in out, out


# --- the real training job ---------------------------------------------------------------


def _mpirun(np_: int, args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = _clean_env()
    for name in ("OMPI_MCA_oob_tcp_if_include", "OMPI_MCA_btl_tcp_if_include"):
        env.setdefault(name, "lo")
    try:
        return subprocess.run(
            ["mpirun", "-np", str(np_), str(PY), str(ROOT / "launcher.py"), *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mpirun did not finish within {timeout} s:\n{exc.stdout}\n{exc.stderr}")


@pytest.mark.timeout(2 * TRAIN_TIMEOUT_S + 60)
def test_sbatch_training_equals_mpirun_bit_for_bit(cluster, workdir):
    ref = _mpirun(3, [*TRAIN_FLAGS, "--dump-state", "mpirun.npz"], workdir, TRAIN_TIMEOUT_S)
    assert ref.returncode == 0, f"mpirun reference run failed:\n{ref.stdout}\n{ref.stderr}"

    rc, out = cluster.sbatch(
        TRAIN,
        ["-n", "3", "-O"],
        [*TRAIN_FLAGS, "--dump-state", "slurm.npz"],
        workdir,
        TRAIN_TIMEOUT_S,
    )
    assert rc == 0, out + cluster.daemon_logs()
    slurm, ref = load_dump(workdir / "slurm.npz"), load_dump(workdir / "mpirun.npz")
    assert_dumps_equal(slurm, ref, "sbatch vs mpirun")


@pytest.mark.timeout(SMALL_JOB_TIMEOUT_S + 60)
def test_launcher_reports_srun_without_pmix(cluster, workdir):
    rc, out = cluster.sbatch(
        TRAIN,
        ["-n", "3", "-O"],
        [*TRAIN_FLAGS],
        workdir,
        SMALL_JOB_TIMEOUT_S,
        extra_env={"SLURM_MPI_TYPE": "none"},
    )
    assert rc != 0, out
    assert "OMPI was not built with SLURM's PMI support" not in out, (
        "OpenMPI aborted in MPI_Init before the launcher could explain: launcher.py must call "
        "cpu_dist.common.slurm.check_launch_environment() before `from mpi4py import MPI`\n" + out
    )
    assert "SLURM_NTASKS=3" in out and "srun --mpi=pmix" in out, out
