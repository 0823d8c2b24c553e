"""Evaluation users can trust: the final evaluation of file data scores every row of the eval
split (the last partial batch included), so its figures do not depend on the batch size, and
serving a bundle with the same defaults scores what the job scored; each evaluation is printed;
a logged loss is the mean over its interval; the summary reduces the workers' figures (real
mpirun jobs, real PS ranks)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from cpu_dist.common.metrics_log import read_records
from cpu_dist.data import make_dataset
from cpu_dist.data.generate import write_file

from .launch import ROOT, SMALL, mpirun

pytestmark = pytest.mark.timeout(600)


def flags_without(flags: list[str], *names: str) -> list[str]:
    out = list(flags)
    for name in names:
        i = out.index(name)
        del out[i : i + 2]
    return out


def lines(path) -> list[dict]:
    return read_records(path)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """One job on a 1000-line file (900 training rows: 9 steps of 96; 100 eval rows: one
    batch and a partial one) logged every step, and the same job logged every third step."""
    tmp = tmp_path_factory.mktemp("eval")
    tsv = write_file(tmp / "train.txt", 1000)
    base = ["--worker-num", "2", *flags_without(SMALL, "--max_step", "--eval-batches")]
    base += ["--data", "criteo", "--data-path", str(tsv), "--max-ind-range", "5000"]
    out = {}
    for freq in ("1", "3"):
        m = tmp / f"m{freq}.jsonl"
        argv = [*flags_without(base, "--print-freq"), "--print-freq", freq, "--metrics-out", str(m)]
        if freq == "1":
            argv += ["--export", str(tmp / "bundle")]
        proc = mpirun(3, argv)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[freq] = (proc, lines(m))
    return tmp, tsv, out


def test_the_final_evaluation_scores_every_eval_row_and_is_printed(jobs):
    _, _, out = jobs
    proc, log = out["1"]
    final = [x for x in log if "eval_auc" in x][-1]
    assert final["eval_samples"] == 100  # 96 + the partial 4, on two workers
    printed = f"step 9: eval_auc {final['eval_auc']:.4f}  eval_logloss {final['eval_logloss']:.4f}"
    assert printed in proc.stdout


def test_serving_scores_what_the_job_scored_at_any_batch_size(jobs):
    tmp, tsv, out = jobs
    final = [x for x in out["1"][1] if "eval_auc" in x][-1]
    serve = [sys.executable, "-m", "cpu_dist.serving", str(tmp / "bundle"), "--data", "criteo"]
    serve += ["--data-path", str(tsv), "--max-ind-range", "5000"]
    # the bundle knows its data settings: --data-path alone is enough
    bare = [sys.executable, "-m", "cpu_dist.serving", str(tmp / "bundle"), "--data-path", str(tsv)]
    for argv in ([*serve, "--batch-size", "96"], [*serve, "--batch-size", "37"], bare):
        proc = subprocess.run(
            argv,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        assert got["eval_samples"] == 100
        assert got["eval_auc"] == pytest.approx(final["eval_auc"], abs=1e-6)
        assert got["eval_logloss"] == pytest.approx(final["eval_logloss"], abs=1e-6)


def test_the_logged_loss_is_the_mean_over_its_interval(jobs):
    _, _, out = jobs
    every = {x["step"]: x["loss"] for x in out["1"][1] if "loss" in x}
    thirds = {x["step"]: x["loss"] for x in out["3"][1] if "loss" in x}
    assert sorted(thirds) == [3, 6, 9] and sorted(every) == list(range(1, 10))
    for step, loss in thirds.items():
        window = [every[s] for s in range(step - 2, step + 1)]
        assert loss == pytest.approx(sum(window) / 3, rel=1e-9)
        assert loss != pytest.approx(every[step], rel=1e-9)  # not the last batch's


def _serve(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cpu_dist.serving", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_serving_refuses_data_of_another_kind_or_hashing(jobs):
    tmp, tsv, _ = jobs
    bundle = str(tmp / "bundle")
    proc = _serve(bundle, "--data", "synthetic")
    assert proc.returncode == 2
    assert "was trained on Criteo data" in proc.stderr and "--data synthetic" in proc.stderr
    proc = _serve(bundle, "--data-path", str(tsv), "--max-ind-range", "100")
    assert proc.returncode == 2
    assert "its keys were made with --max-ind-range 5000; --max-ind-range 100" in proc.stderr


def test_the_summary_reduces_the_per_worker_figures_over_the_workers(jobs):
    """(issue 23 item 4) ``<key>_sum``/``_max``/``_mean`` over both workers beside worker
    0's own figures under the old names."""
    _, tsv, out = jobs
    s = out["1"][1][-1]["summary"]
    # with ps aggregation each worker hands over the gradients of its share's unique keys
    data = make_dataset("criteo", path=tsv, max_ind_range=5000)
    pushed = [
        sum(len(np.unique(data.worker_batch(t, 96, r, 2).keys)) for t in range(9)) for r in range(2)
    ]
    assert s["rows_pushed"] == pushed[0]  # the old key: worker 0's, as before
    assert s["rows_pushed_sum"] == sum(pushed)
    assert s["bytes_pushed_sum"] > s["bytes_pushed"] > 0
    assert s["t_forward"] > 0 and s["t_forward_mean"] > 0
    assert s["exposed_sparse_s_max"] >= s["exposed_sparse_s"]
    assert s["staleness_max_max"] == 0 and s["staleness_mean_mean"] == 0
