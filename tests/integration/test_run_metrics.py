"""Issue 54 items 2-4 on real jobs: the same W=1 and W=2 jobs (mpirun, real PS ranks, float64
dense parameters so that the figures agree to 1e-9) report the same evaluation and train
figures; the final eval line equals torchmetrics' and torch's formulas on the scores the
serving CLI writes for the same split; a user's torchmetrics.Metric from a file outside the
package is in the JSONL and TensorBoard; TensorBoard's tags are grouped and its phase curves
per step; a run without a terminal logs no carriage return."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from torchmetrics.functional.classification import binary_auroc

from cpu_dist.common.metrics_log import read_records
from cpu_dist.data import eval_batches, make_dataset
from cpu_dist.data.generate import write_file
from cpu_dist.testing.user_code import USER_METRIC

from .launch import SMALL, mpirun, run_module, with_flags

pytestmark = pytest.mark.timeout(600)

FIGURES = ("auc", "logloss", "ne", "calibration", "ctr", "mean_prediction")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 9-step job (1000-line file: 900 training rows, 100 eval rows) at W=1 and W=2, logged
    every 3 steps with the progress on (captured: no terminal), a --metric of a file in the
    test's directory, TensorBoard; the W=1 job exported."""
    tmp = tmp_path_factory.mktemp("run_metrics")
    tsv = write_file(tmp / "train.txt", 1000)
    (tmp / "user_metrics.py").write_text(USER_METRIC)
    flags = with_flags(SMALL, {"--max_step": None, "--eval-batches": None, "--print-freq": "3"})
    flags = [f for f in flags if f != "--no-progress"]
    flags += ["--data", "criteo", "--data-path", str(tsv), "--max-ind-range", "5000"]
    flags += ["--dtype", "float64", "--metric-window", "4"]
    flags += ["--metric", f"{tmp / 'user_metrics.py'}:MeanPrediction"]
    out = {}
    for w in (1, 2):
        argv = ["--worker-num", str(w), *flags, "--metrics-out", str(tmp / f"w{w}.jsonl")]
        argv += ["--tensorboard", str(tmp / f"tb{w}")]
        if w == 1:
            argv += ["--export", str(tmp / "bundle")]
        proc = mpirun(w + 1, argv)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[w] = (proc, read_records(tmp / f"w{w}.jsonl"))
    return tmp, tsv, out


def _final_eval(log: list[dict]) -> dict:
    return [r for r in log if "eval_auc" in r][-1]


def test_any_worker_count_reports_the_same_figures(runs):
    _, _, out = runs
    evals = [_final_eval(out[w][1]) for w in (1, 2)]
    for name in FIGURES:
        assert evals[1][f"eval_{name}"] == pytest.approx(evals[0][f"eval_{name}"], rel=1e-9)
    steps = [[r for r in out[w][1] if "loss" in r] for w in (1, 2)]
    assert [r["step"] for r in steps[0]] == [3, 6, 9] == [r["step"] for r in steps[1]]
    for one, two in zip(*steps):
        assert two["train_auc"] == pytest.approx(one["train_auc"], rel=1e-9)
        assert two["train_ne"] == pytest.approx(one["train_ne"], rel=1e-9)
        assert one["lr"] == 0.1 and one["lr_embedding"] == 0.1


def test_the_eval_line_equals_torchmetrics_on_the_scores_serving_writes(runs):
    tmp, tsv, out = runs
    scores = tmp / "scores.txt"
    proc = run_module("cpu_dist.serving", str(tmp / "bundle"), "--scores-out", str(scores))
    assert proc.returncode == 0, proc.stderr[-3000:]
    p = torch.from_numpy(np.loadtxt(scores, dtype=np.float64))
    data = make_dataset("criteo", path=tsv, max_ind_range=5000)
    y = torch.from_numpy(np.concatenate([b.labels for b in eval_batches(data, 96, None)]))
    y = y.double()
    assert len(p) == len(y) == 100
    ctr = float(y.mean())
    logloss = float(torch.nn.functional.binary_cross_entropy(p, y))
    want = {
        "auc": float(binary_auroc(p, y.long())),
        "logloss": logloss,
        "ne": logloss / -(ctr * math.log(ctr) + (1 - ctr) * math.log(1 - ctr)),
        "calibration": float(p.sum() / y.sum()),
        "ctr": ctr,
        "mean_prediction": float(p.mean()),
    }
    got = _final_eval(out[1][1])
    for name, value in want.items():
        assert got[f"eval_{name}"] == pytest.approx(value, abs=1e-9), name


def test_tensorboard_holds_the_user_metric_in_groups_with_per_step_phases(runs):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tmp, _, out = runs
    events = EventAccumulator(str(tmp / "tb1"))
    events.Reload()
    tags = events.Tags()["scalars"]
    # (one Criteo file: no test split, so no test/ group)
    assert {t.split("/")[0] for t in tags} == {"train", "eval", "lr", "phase_ms", "ps"}
    assert {"eval/mean_prediction", "eval/ne", "train/auc", "lr/dense"} <= set(tags)
    log = out[1][1]
    assert [e.value for e in events.Scalars("eval/mean_prediction")] == [
        pytest.approx(_final_eval(log)["eval_mean_prediction"], rel=1e-6)
    ]
    cumulative = [0.0] + [r["t_forward"] for r in log if "loss" in r]
    per_step = [(b - a) * 1e3 / 3 for a, b in itertools.pairwise(cumulative)]
    got = [e.value for e in events.Scalars("phase_ms/forward")]
    assert got == pytest.approx(per_step, rel=1e-5)  # (TensorBoard stores float32)


def test_a_run_without_a_terminal_logs_lines_not_bar_frames(runs):
    _, _, out = runs
    for w in (1, 2):
        proc = out[w][0]
        assert "\r" not in proc.stdout and "\r" not in proc.stderr
        lines = [x for x in proc.stdout.splitlines() if "samples/s (run average)" in x]
        assert [x.split(":")[0] for x in lines] == ["step 3/9", "step 6/9", "step 9/9"]
