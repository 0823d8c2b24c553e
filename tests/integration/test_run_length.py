"""No success for doing nothing: a job on file data trains one whole epoch unless told
otherwise and says how many steps at the start; a job that cannot train one step fails naming
the sizes; a resume whose checkpoint is at or past --max_step exits 0 with "nothing to do"
(real mpirun jobs, real PS ranks)."""

from __future__ import annotations

import pytest

from cpu_dist.data.generate import write_file
from cpu_dist.train.metrics import read_summary

from .launch import SMALL, mpirun, with_flags

pytestmark = pytest.mark.timeout(300)


def without_max_step(flags: list[str]) -> list[str]:
    return with_flags(flags, {"--max_step": None})


@pytest.fixture(scope="module")
def tsv(tmp_path_factory):
    # 1000 lines: every 10th held out, 900 training rows, 9 steps of 96 per epoch
    return write_file(tmp_path_factory.mktemp("rl") / "train.txt", 1000)


def test_file_data_without_step_flags_trains_one_epoch(tsv, tmp_path):
    metrics = tmp_path / "m.jsonl"
    argv = ["--worker-num", "2", *without_max_step(SMALL), "--data", "criteo"]
    argv += ["--data-path", str(tsv), "--metrics-out", str(metrics)]
    proc = mpirun(3, argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cpu_dist: training 9 steps: --epochs 1 x 9 steps per epoch" in proc.stdout
    assert read_summary(metrics)["steps"] == 9


def test_a_batch_larger_than_the_data_is_an_error(tsv):
    argv = ["--worker-num", "2", *without_max_step(SMALL), "--batch-size", "960"]
    proc = mpirun(3, [*argv, "--data", "criteo", "--data-path", str(tsv)])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "launcher.py: error:" in proc.stderr and "Traceback" not in proc.stderr
    assert "--batch-size 960 is larger than the training split (900 rows" in proc.stderr
    assert "samples_per_s" not in proc.stdout


def with_steps(flags: list[str], steps: int) -> list[str]:
    return with_flags(flags, {"--max_step": str(steps)})


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """The flags of a finished 10-step run with a checkpoint of its last step."""
    ckpt = tmp_path_factory.mktemp("finished") / "ckpt"
    flags = ["--worker-num", "2", *with_steps(SMALL, 10), "--checkpoint-dir", str(ckpt)]
    flags += ["--checkpoint-every", "10"]
    proc = mpirun(3, flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return flags


@pytest.mark.parametrize("max_step", [10, 6])
def test_a_resume_at_or_past_max_step_has_nothing_to_do(finished, max_step, tmp_path):
    metrics = tmp_path / "again.jsonl"
    metrics.write_text('{"step": 10, "loss": 0.5}\n')  # the finished run's log stays
    again = [*with_steps(finished, max_step), "--resume", "--metrics-out", str(metrics)]
    proc = mpirun(3, again)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"nothing to do: checkpoint at step 10, --max_step {max_step}" in proc.stdout
    assert "samples_per_s" not in proc.stdout  # no summary of a run that did not run
    assert metrics.read_text() == '{"step": 10, "loss": 0.5}\n'
