"""Start a real mpirun job in the background, watch its progress, kill one of its ranks.

Used by the fault and checkpoint tests: the job is launcher.py under mpirun exactly as users
run it; progress is read from its --metrics-out file (one line per step with --print-freq 1),
and a rank is found by the OMPI_COMM_WORLD_RANK that mpirun puts in each process's environment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .launch import MPI_ENV, ROOT


class Job:
    def __init__(self, np_: int, args: list[str], metrics: Path) -> None:
        self.metrics = metrics
        env = {**os.environ, **MPI_ENV}
        cmd = [
            "mpirun",
            "-np",
            str(np_),
            sys.executable,
            str(ROOT / "launcher.py"),
            *args,
            "--metrics-out",
            str(metrics),
            "--print-freq",
            "1",
        ]
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def steps_logged(self) -> int:
        try:
            with open(self.metrics, encoding="utf-8") as f:
                return sum(1 for line in f if line.startswith('{"step"'))
        except FileNotFoundError:
            return 0

    def wait_for_steps(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.steps_logged() < n:
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise AssertionError(
                    f"job ended (exit {self.proc.returncode}) before step {n}"
                    f"\n{out[-2000:]}\n{err[-4000:]}"
                )
            if time.monotonic() > deadline:
                self.kill_all()
                raise AssertionError(f"no step {n} within {timeout} s")
            time.sleep(0.1)

    def rank_pids(self) -> dict[int, int]:
        """World rank -> pid of this job's launcher.py processes (mpirun's children)."""
        out: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.getsid(int(entry)) != self.proc.pid:
                    continue
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if b"launcher.py" not in f.read():
                        continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except (OSError, ProcessLookupError):
                continue
            for item in env:
                if item.startswith(b"OMPI_COMM_WORLD_RANK="):
                    out[int(item.split(b"=", 1)[1])] = int(entry)
        return out

    def kill_rank(self, rank: int) -> float:
        """SIGKILL one rank; returns the monotonic time of the kill."""
        pids = self.rank_pids()
        assert rank in pids, f"rank {rank} not found among {pids}"
        os.kill(pids[rank], signal.SIGKILL)
        return time.monotonic()

    def finish(self, timeout: float) -> tuple[int, str, str]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            out, err = self.proc.communicate()
            raise AssertionError(f"job still running {timeout} s later\n{err[-4000:]}") from None
        return self.proc.returncode, out, err

    def kill_all(self) -> None:
        """Ends this job's process group (mpirun and the ranks it started), nothing else."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
