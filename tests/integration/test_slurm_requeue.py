"""Preemption under Slurm, on the private one-node cluster of ``test_slurm.py``: a training job
signalled with ``scancel --signal=TERM`` (what preemption and scancel deliver to the tasks)
checkpoints, exits 75, ``train.sbatch`` requeues it, and the requeued run resumes by itself and
finishes.  Real sbatch, srun --mpi=pmix, launcher.py."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from .launch import SMALL, with_flags
from .test_slurm import TRAIN, TRAIN_TIMEOUT_S, cluster, workdir  # noqa: F401 (fixtures)

STEPS = 2000  # about 30 s here: long enough to be stopped part way
FLAGS = [
    *("--worker-num", "2"),
    *with_flags(SMALL, {"--max_step": str(STEPS), "--print-freq": "1"}),
    *("--checkpoint-dir", "ck", "--checkpoint-every", "1000"),
]


def _steps_logged(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.startswith('{"step"'))
    except FileNotFoundError:
        return 0


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
        rc = proc.wait(timeout=TRAIN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            cluster.run(["scancel", job_id], timeout=30, cwd=workdir)
            proc.kill()
    text = out.read_text(errors="replace")
    assert rc == 0, text + cluster.daemon_logs()
    assert "stopped on request" in text and "requeueing job" in text, text
    assert "adding --resume" in text and "resumed from" in text, text
    stopped_at = [
        json.loads(m.read_text())["step"] for m in (workdir / "ck").glob("step-*/manifest.json")
    ]
    assert stopped_at, text
    # the last run's summary: every step of the run done, the first part not repeated
    summary = [
        json.loads(line)["summary"]
        for line in (workdir / "m.jsonl").read_text().splitlines()
        if line.startswith('{"summary"')
    ]
    assert summary and summary[-1]["steps"] == STEPS, summary
