"""The suite says what it did not run: scripts/test.sh lists every skipped test with its
reason and ends with ``N passed, N failed, N skipped``; under ``CPU_DIST_REQUIRE`` (which
``.ci/run`` sets) a skip of the network-lab or Slurm tests is a failure.

Each test runs the real script (or .ci/run) on a small generated test file, with only the unit
phase and results in a temporary folder (the suite's own logs/ stay untouched)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)

GENERATED = """
import pytest

@pytest.fixture(scope="module")
def lab():
    pytest.skip("no network lab here: network namespaces need root")

def test_passes():
    assert True

def test_fails():
    assert 1 == 2

@pytest.mark.netlab
def test_on_other_hosts(lab):
    pass

@pytest.mark.slurm
@pytest.mark.skipif(True, reason="Slurm cannot be installed here")
def test_batch_script():
    pass

class TestSizes:
    @pytest.mark.parametrize("n", [1, 2])
    def test_size(self, n):
        if n == 2:
            pytest.skip("needs two GPUs\\nthis machine has none")
"""


def run(cmd: list[str], tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``cmd`` on ``args`` with only the unit phase, no set-up, logs under ``tmp``; the
    caller's CPU_DIST_REQUIRE and pytest options do not leak in."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CPU_DIST_REQUIRE", "CPU_DIST_TEST_", "PYTEST_"))
    }
    base.update(
        CPU_DIST_SKIP_SETUP="1", CPU_DIST_TEST_PHASES="unit", CPU_DIST_TEST_LOGS=str(tmp / "logs")
    )
    base.update(env)
    return subprocess.run(
        ["bash", *cmd, *args],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.fixture
def generated(tmp_path: Path) -> Path:
    path = tmp_path / "gen" / "test_generated.py"
    path.parent.mkdir()
    path.write_text(GENERATED)
    return path


TEST_SH = [str(ROOT / "scripts" / "test.sh")]


def output_lines(got: subprocess.CompletedProcess[str]) -> list[str]:
    """The run's lines with the generated file's folder cut from its test ids: pytest names
    a file outside the checkout relative to a root that depends on where the checkout and
    the temporary folder are (a CI clone in /tmp names it pytest-of-root/...)."""
    folder = re.compile(r"(\[\w+\] )\S*/(test_generated\.py::)")
    return [folder.sub(r"\1\2", x) for x in got.stdout.splitlines()]


def test_every_skip_is_listed_with_its_reason_and_counted(tmp_path, generated):
    got = run(TEST_SH, tmp_path, str(generated))
    lines = output_lines(got)
    assert got.returncode == 1, got.stdout + got.stderr  # test_fails failed
    assert lines[-1] == "2 passed, 1 failed, 3 skipped", got.stdout
    listed = lines[lines.index("== skipped: 3 (phase, test, reason)") + 1 : -1]
    assert listed == [
        "  [unit] test_generated.py::test_on_other_hosts: "
        "no network lab here: network namespaces need root",
        "  [unit] test_generated.py::test_batch_script: Slurm cannot be installed here",
        "  [unit] test_generated.py::TestSizes::test_size[2]: needs two GPUs",
        "      this machine has none",
    ], got.stdout
    assert "phase unit: 2 passed, 1 failed, 3 skipped (exit 1)" in lines


def test_a_required_groups_skip_fails_the_run(tmp_path, generated):
    got = run(TEST_SH, tmp_path, str(generated), CPU_DIST_REQUIRE="netlab")
    lines = output_lines(got)
    assert got.returncode == 1
    assert lines[-1] == "2 passed, 2 failed, 2 skipped", got.stdout
    assert (
        "test_generated.py::test_on_other_hosts was skipped, but CPU_DIST_REQUIRE=netlab "
        "requires the netlab tests to run on this machine." in got.stdout
    )
    assert "no network lab here: network namespaces need root" in got.stdout
    # the other skips are not required: still listed as skips
    assert "  [unit] test_generated.py::test_batch_script: Slurm cannot be installed here" in lines
    assert not any("[unit] test_generated.py::test_on_other_hosts" in x for x in lines)


def test_ci_requires_the_lab_and_slurm(tmp_path, generated):
    got = run([str(ROOT / ".ci" / "run")], tmp_path, str(generated))
    assert got.stdout.splitlines()[-1] == "2 passed, 3 failed, 1 skipped", got.stdout
    assert "CPU_DIST_REQUIRE=netlab,slurm requires the netlab tests" in got.stdout
    assert "CPU_DIST_REQUIRE=netlab,slurm requires the slurm tests" in got.stdout


def test_an_unknown_group_is_refused(tmp_path, generated):
    got = run(TEST_SH, tmp_path, str(generated), CPU_DIST_REQUIRE="netlab,slrum")
    assert got.returncode != 0
    assert "CPU_DIST_REQUIRE=netlab,slrum: unknown test group(s) slrum" in got.stdout + got.stderr
    assert got.stdout.splitlines()[-1] == "0 passed, 1 failed, 0 skipped", got.stdout


def test_the_unit_phase_leaves_the_mpi_tests_to_the_mpi_phases(tmp_path):
    """Collected without --with-mpi, every test of tests/mpi would be a skip."""
    got = run(TEST_SH, tmp_path, "tests/mpi")
    assert got.stdout.splitlines()[-1] == "0 passed, 0 failed, 0 skipped", got.stdout
    assert got.returncode == 0


SLOW = """
import time

def test_a_fast():
    pass

def test_b_outlives_the_limit():
    time.sleep(120)  # deliberately slower than the phase's limit: not a synchronisation

def test_c_never_started():
    pass
"""


def test_a_phase_stopped_at_its_limit_still_counts_what_it_finished(tmp_path):
    path = tmp_path / "gen" / "test_slow.py"
    path.parent.mkdir()
    path.write_text(SLOW)
    got = run(TEST_SH, tmp_path, str(path), CPU_DIST_TEST_UNIT_LIMIT_S="8")
    lines = output_lines(got)
    assert got.returncode == 1
    assert "phase unit: stopped at its wall-clock limit; counted: the tests it finished" in lines
    assert lines[-1] == "1 passed, 1 failed, 0 skipped", got.stdout


MPI_GENERATED = """
import pytest
from mpi4py import MPI

@pytest.mark.mpi(min_size=2)
def test_zz_sums_over_ranks():
    assert MPI.COMM_WORLD.allreduce(1) == MPI.COMM_WORLD.Get_size()

def test_zz_plain():
    pass
"""


def test_the_mpi_phase_leaves_the_other_tests_to_the_unit_phase(tmp_path):
    """Under mpirun only the MPI tests run; the others are deselected, not listed as skips
    ("test does not use mpi").  -k zz leaves out tests/mpi's own tests."""
    path = tmp_path / "gen" / "test_zz_mpi.py"
    path.parent.mkdir()
    path.write_text(MPI_GENERATED)
    got = run(TEST_SH, tmp_path, str(path), "-k", "zz", CPU_DIST_TEST_PHASES="mpi-np3")
    assert got.stdout.splitlines()[-1] == "1 passed, 0 failed, 0 skipped", got.stdout
    assert got.returncode == 0, got.stdout + got.stderr


@pytest.mark.parametrize(
    "group,path",
    [
        ("netlab", "test_hosts.py"),
        ("slurm", "test_slurm.py"),
        ("slurm", "test_slurm_requeue.py"),  # the private cluster of test_slurm.py too
    ],
    ids=["lab", "slurm", "slurm-requeue"],
)
def test_the_lab_and_slurm_tests_are_in_their_groups(group, path):
    """Every test of the file carries the group's marker (else CPU_DIST_REQUIRE misses it)."""
    file = f"tests/integration/{path}"

    def collected(expr: str) -> list[str]:
        got = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", expr, file],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert got.returncode in (0, 5), got.stdout + got.stderr
        return [x for x in got.stdout.splitlines() if x.startswith(file + "::")]

    assert len(collected(group)) > 0
    assert collected(f"not {group}") == []
