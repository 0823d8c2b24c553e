"""A job asked to stop (SIGTERM to its ranks, as Slurm delivers it, or SIGUSR1 to mpirun, which
forwards it) writes a checkpoint at the next step boundary and exits with EXIT_STOPPED; the
resumed run ends with the bits of a run never stopped, and may change the learning rates and
the step count (it says so), not the must-match settings.  Checkpoints are numbered by the
steps they hold.  Real mpirun jobs, real PS ranks."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from cpu_dist.checkpoint.manifest import step_dir_name, steps_done
from cpu_dist.common.mpi_context import EXIT_STOPPED

from .jobctl import Job
from .launch import SMALL, assert_dumps_equal, load_dump, mpirun, train

pytestmark = pytest.mark.timeout(500)
OPT = ["--dense-optimizer", "adamw", "--sparse-optimizer", "rowwise_adagrad"]


def ckpt(d: Path) -> list[str]:
    # no periodic checkpoints: the one there is the stop's, however many steps a fast machine
    # runs before the signal arrives
    return ["--checkpoint-dir", str(d)]


def checkpoints(d: Path) -> dict[str, int]:
    """step directory name -> the manifest's step (the last step it holds)."""
    return {
        m.parent.name: json.loads(m.read_text())["step"] for m in d.glob("step-*/manifest.json")
    }


def stop_job(tmp_path: Path, d: Path, how: str) -> tuple[int, str]:
    job = Job(
        3,
        ["--worker-num", "2", *SMALL, *OPT, "--max_step", "100000", *ckpt(d)],
        tmp_path / f"{how}.jsonl",
    )
    try:
        job.wait_for_steps(6, timeout=180)
        if how == "ranks":  # what Slurm's scancel and preemption do: every task gets it
            for pid in job.rank_pids().values():
                os.kill(pid, signal.SIGTERM)
        elif how == "ps":  # the PS rank alone: it passes the request on to worker 0
            os.kill(job.rank_pids()[2], signal.SIGTERM)
        else:  # mpirun forwards SIGUSR1 to every rank
            os.kill(job.proc.pid, signal.SIGUSR1)
        rc, _out, err = job.finish(timeout=120)
    finally:
        job.kill_all()
    return rc, err


def test_sigterm_to_the_ranks_checkpoints_stops_and_resumes_to_the_same_bits(tmp_path):
    d = tmp_path / "ck"
    rc, err = stop_job(tmp_path, d, "ranks")
    assert rc == EXIT_STOPPED, err[-3000:]
    assert "stopped on request" in err, err[-3000:]
    saved = checkpoints(d)
    assert len(saved) == 1, saved
    ((name, last),) = saved.items()
    assert name == step_dir_name(steps_done(last)) == f"step-{last + 1:08d}"
    assert f"after {last + 1} steps" in err
    end = last + 1 + 6
    want = train(tmp_path, "whole", 2, 1, [*OPT, "--max_step", str(end)])
    got = train(tmp_path, "resumed", 2, 1, [*OPT, "--max_step", str(end), "--resume", *ckpt(d)])
    assert_dumps_equal(got, want, "stopped and resumed")


@pytest.mark.parametrize("how", ["mpirun", "ps"])
def test_sigusr1_to_mpirun_or_sigterm_to_a_ps_rank_stops_the_job_the_same_way(tmp_path, how):
    d = tmp_path / "ck"
    rc, err = stop_job(tmp_path, d, how)
    assert rc == EXIT_STOPPED, err[-3000:]
    assert len(checkpoints(d)) == 1


def test_a_resume_may_change_the_learning_rates_and_says_so(tmp_path):
    d = tmp_path / "ck"
    train(
        tmp_path,
        "a",
        1,
        1,
        ["--max_step", "4", "--checkpoint-dir", str(d), "--checkpoint-every", "4"],
    )
    assert checkpoints(d) == {"step-00000004": 3}  # after 4 steps
    resume = ["--max_step", "8", "--resume", "--checkpoint-dir", str(d)]
    same = train(tmp_path, "same", 1, 1, resume)
    proc = mpirun(
        2,
        [
            "--worker-num",
            "1",
            *SMALL,
            *resume,
            "--lr",
            "0.05",
            "--sparse-lr",
            "0.02",
            "--dump-state",
            str(tmp_path / "lr.npz"),
        ],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "changed since the checkpoint" in proc.stderr
    assert "--lr 0.1 -> 0.05" in proc.stderr and "--max_step 4 -> 8" in proc.stderr
    with np.load(tmp_path / "lr.npz") as z:
        lower = {k: z[k] for k in z.files}
    # both learning rates took effect: dense parameters and sparse rows differ
    moved = [k for k in same if not np.array_equal(same[k], lower[k])]
    assert any(k.startswith("dense/") for k in moved) and "table/embedding/values" in moved, moved


def test_sigterm_to_mpirun_checkpoints_within_the_grace_env_sh_sets(tmp_path, monkeypatch):
    """OpenMPI's own kill sequence after SIGTERM to mpirun: the ranks get SIGTERM after the
    grace and have the grace again to checkpoint; mpirun itself exits 1 (docs/operations.md)."""
    from cpu_dist.common.launch_env import mpi_env

    env = mpi_env({**os.environ, "CPU_DIST_STOP_GRACE_S": "6"})
    assert env["OMPI_MCA_odls_base_sigkill_timeout"] == "6"
    monkeypatch.setenv("OMPI_MCA_odls_base_sigkill_timeout", "6")
    d = tmp_path / "ck"
    job = Job(
        3,
        ["--worker-num", "2", *SMALL, "--max_step", "100000", *ckpt(d)],
        tmp_path / "m.jsonl",
    )
    try:
        job.wait_for_steps(4, timeout=180)
        os.kill(job.proc.pid, signal.SIGTERM)
        rc, _out, err = job.finish(timeout=120)
    finally:
        job.kill_all()
    assert rc != 0 and "stopped on request" in err, err[-3000:]
    assert len(checkpoints(d)) == 1, err[-3000:]


def test_sigterm_to_run_sh_reaches_the_ranks_at_once(tmp_path):
    """scripts/run.sh turns a SIGTERM into SIGUSR1 for mpirun and exits with the job's code.
    Run from a copy of the project whose setup step does nothing (the real one may build)."""
    import shutil
    import subprocess
    import time

    from .launch import MPI_ENV, ROOT

    proj = tmp_path / "proj"
    (proj / "scripts").mkdir(parents=True)
    for rel in ("scripts/run.sh", "scripts/env.sh", "launcher.py"):
        shutil.copy2(ROOT / rel, proj / rel)
    (proj / "scripts" / "setup.sh").write_text("exit 0\n")
    for rel in (".venv", "cpu_dist", "gpu_cache"):
        (proj / rel).symlink_to(ROOT / rel)
    d, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    args = [*SMALL, "--max_step", "100000", *ckpt(d), "--metrics-out", str(metrics)]
    proc = subprocess.Popen(
        ["bash", str(proj / "scripts" / "run.sh"), *args, "--print-freq", "1"],
        env={**os.environ, **MPI_ENV, "NP": "3", "WORKERS": "2"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not (metrics.exists() and metrics.read_text().count('{"step"') >= 4):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no step 4 in time"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == EXIT_STOPPED, err[-3000:]
    assert "stopped on request" in err and len(checkpoints(d)) == 1, err[-3000:]


def test_a_stop_during_the_final_evaluation_exits_75_and_the_resume_makes_what_it_owes(tmp_path):
    """The stop arrives as the final evaluation starts (worker 0 sends itself SIGTERM there,
    CPU_DIST_TEST_STOP_AT): the job exits 75 with a checkpoint after its last step that owes
    every output; the requeued --resume makes exactly those, as the run never stopped did."""
    from cpu_dist.checkpoint.coordinator import TEST_STOP_AT_ENV
    from cpu_dist.checkpoint.manifest import find_latest

    d, bundle, log, dump = (tmp_path / n for n in ("ck", "bundle", "m.jsonl", "d.npz"))
    flags = ["--worker-num", "1", *SMALL, *ckpt(d), "--export", str(bundle)]
    flags += ["--metrics-out", str(log), "--dump-state", str(dump)]
    stopped = mpirun(2, flags, env={TEST_STOP_AT_ENV: "final_eval"})
    assert stopped.returncode == EXIT_STOPPED, stopped.stderr[-3000:]
    assert "stopped on request after 20 steps" in stopped.stderr
    m = find_latest(d)
    assert m is not None and m.owed == ["final_eval", "test", "dump_state", "export"]
    assert not bundle.exists() and not dump.exists() and not (d / "OWNER.json").exists()
    assert "eval_auc" not in log.read_text()

    resumed = mpirun(2, [*flags, "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "making what the stopped run owes: the final evaluation" in resumed.stdout
    assert find_latest(d).owed == []
    assert (bundle / "manifest.json").exists()
    whole = train(tmp_path, "whole", 1, 1, ["--metrics-out", str(tmp_path / "whole.jsonl")])
    assert_dumps_equal(load_dump(dump), whole, "the owed dump, made on resume")

    def finals(path: Path) -> dict:
        return {
            k: v
            for line in path.read_text().splitlines()
            for k, v in json.loads(line).items()
            if k.startswith(("eval_", "test_"))
        }

    assert finals(log) == finals(tmp_path / "whole.jsonl") != {}
