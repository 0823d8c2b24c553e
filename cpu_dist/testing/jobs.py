"""Whole training jobs (``mpirun ... launcher.py``) as benchmarks run them: one place builds
the command, its environment (``scripts/env.sh``, as users run) and the flags of a job that
is run only to be measured, so the benchmarks cannot drift apart in how they start a job."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from cpu_dist.common.launch_env import mpi_env

LAUNCHER = Path(__file__).resolve().parents[2] / "launcher.py"


def launcher_argv(np_: int, args: Sequence[str]) -> list[str]:
    """``mpirun -np np_`` of this checkout's ``launcher.py`` with ``args``, in this Python."""
    return ["mpirun", "-np", str(np_), sys.executable, str(LAUNCHER), *args]


def measured_flags(batch_size: int, steps: int, metrics_out: Path | str) -> list[str]:
    """A job run to be measured: ``steps`` steps of ``batch_size``, no evaluation but one
    batch at the end, no progress bar, one metrics line at the end (its summary follows) in
    ``metrics_out``.  Later flags of the same name override these."""
    return [
        *("--batch-size", str(batch_size), "--max_step", str(steps)),
        *("--eval-every", "0", "--eval-batches", "1", "--no-progress"),
        *("--print-freq", str(steps), "--metrics-out", str(metrics_out)),
    ]


def run_job(name: str, np_: int, args: Sequence[str], timeout_s: float = 3600.0) -> None:
    """Run the job to its end; SystemExit naming ``name``, the exit code and the end of its
    standard error when it fails (a benchmark stops there)."""
    proc = subprocess.run(
        launcher_argv(np_, args), env=mpi_env(), capture_output=True, text=True, timeout=timeout_s
    )
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
