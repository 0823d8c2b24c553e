"""Preemption under Slurm, on the private one-node cluster of ``test_slurm.py``: a training job
signalled with ``scancel --signal=TERM`` (what preemption and scancel deliver to the tasks)
checkpoints, exits 75, ``train.sbatch`` requeues it, and the requeued run resumes by itself and
finishes.  Real sbatch, srun --mpi=pmix, launcher.py."""

from __future__ import annotations

import json
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from cpu_dist.checkpoint.manifest import step_dir_name, steps_done
from cpu_dist.common.metrics_log import read_records

from .launch import SMALL, with_flags
from .test_slurm import TRAIN, TRAIN_TIMEOUT_S, Cluster, cluster, workdir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slurm  # under CPU_DIST_REQUIRE=slurm (.ci/run) a skip is a failure

# Long enough to be stopped part way: the stop is asked for at step 4 and reaches the ranks
# well within a second, while 600 steps take 9-30 s here (2 busy cores) and would take over
# 4 s even at 150 steps/s. No periodic checkpoints: the one there is the stop's.
STEPS = 600
FLAGS = [
    *("--worker-num", "2"),
    *with_flags(SMALL, {"--max_step": str(STEPS), "--print-freq": "1"}),
    *("--checkpoint-dir", "ck"),
]
# The private cluster holds a requeued job (Reason=BeginTime) for AuthInfo's cred_expire + 1 s
# and starts it at the next main scheduling pass (scripts/slurm/cluster.sh: 10 s, every 1 s);
# Slurm's defaults, 120 s and 60 s, were most of this test's time.
REQUEUE_HOLD_MAX_S = 30


def _steps_logged(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.startswith('{"step"'))
    except FileNotFoundError:
        return 0


def _job_record(slurm: Cluster, job_id: str, cwd: Path) -> dict[str, str]:
    """``scontrol -o show job``'s fields (empty once the job record is gone)."""
    got = slurm.run(["scontrol", "-o", "show", "job", job_id], timeout=30, cwd=cwd)
    fields = (f.split("=", 1) for f in got.stdout.split() if "=" in f)
    return dict(fields) if got.returncode == 0 else {}


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


@pytest.mark.timeout(TRAIN_TIMEOUT_S + 120)
def test_a_stopped_job_requeues_and_resumes_by_itself(cluster, workdir):  # noqa: F811
    out = workdir / "job.out"
    proc = subprocess.Popen(
        [
            "sbatch",
            "--parsable",
            "--wait",
            "-n",
            "3",
            "-O",
            "-o",
            str(out),
            str(TRAIN),
            *FLAGS,
            "--metrics-out",
            "m.jsonl",
        ],
        cwd=workdir,
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        job_id = proc.stdout.readline().strip().split(";")[0]
        assert job_id.isdigit(), job_id
        deadline = time.monotonic() + TRAIN_TIMEOUT_S / 2
        while _steps_logged(workdir / "m.jsonl") < 4:
            assert proc.poll() is None, out.read_text(errors="replace") if out.exists() else ""
            assert time.monotonic() < deadline, "no step 4 in time\n" + cluster.daemon_logs()
            time.sleep(0.2)
        cluster.run(["scancel", "--signal=TERM", job_id], timeout=30, cwd=workdir)
        # Slurm's record of the requeued run (Restarts=1): kept while it waits, runs and for
        # MinJobAge seconds after; SubmitTime is the requeue's time.
        requeued: dict[str, str] = {}
        deadline = time.monotonic() + TRAIN_TIMEOUT_S
        while proc.poll() is None:
            assert time.monotonic() < deadline, "the job did not end in time\n" + (
                cluster.daemon_logs()
            )
            record = _job_record(cluster, job_id, workdir)
            if record.get("Restarts") == "1":
                requeued = record
            time.sleep(0.5)
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            cluster.run(["scancel", job_id], timeout=30, cwd=workdir)
            proc.kill()
    text = out.read_text(errors="replace")
    assert rc == 0, text + cluster.daemon_logs()
    assert "stopped on request" in text and "requeueing job" in text, text
    assert "adding --resume" in text and "resumed from" in text, text
    # requeued by Slurm and started again by it, after a hold of cred_expire + 1 s
    assert requeued.get("JobState") in ("RUNNING", "COMPLETING", "COMPLETED"), requeued
    hold = _seconds(requeued["StartTime"]) - _seconds(requeued["SubmitTime"])
    assert 0 <= hold <= REQUEUE_HOLD_MAX_S, (hold, requeued)
    # one checkpoint, the stop's, part way through the run
    saved = {
        m.parent.name: json.loads(m.read_text())["step"]
        for m in (workdir / "ck").glob("step-*/manifest.json")
    }
    assert len(saved) == 1, (saved, text)
    ((name, last),) = saved.items()
    done = steps_done(last)
    assert name == step_dir_name(done) and done < STEPS, (saved, text)
    # the requeued run went on at the step after the checkpoint, not from the start, said so,
    # and continued the first's --metrics-out: every step of the run logged once
    assert f"resuming at step {done:,}: training {STEPS - done:,} more steps" in text, text
    records = read_records(workdir / "m.jsonl")
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == list(range(1, STEPS + 1)), (steps[:3], steps[-3:], done)
    summary = [r["summary"] for r in records if "summary" in r]
    assert summary and summary[-1]["steps"] == STEPS, summary
