"""Issue 54 items 2-4: the evaluation's figures (torchmetrics' AUC, NE, calibration, CTR, log
loss), train AUC and NE over a window, learning rates, a user's torchmetrics.Metric,
TensorBoard's groups and per-step phase curves, the trimmed summary and the progress lines."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torchmetrics.functional.classification import binary_auroc

from cpu_dist.common.config import Config, JobConfig, TrainConfig
from cpu_dist.common.metric_spec import metric_key, metric_spec_problem
from cpu_dist.data import Batch
from cpu_dist.models.scoring import evaluate
from cpu_dist.testing.user_code import USER_METRIC
from cpu_dist.train import metrics, progress, summary
from cpu_dist.train.evaluation import in_data_order, share
from cpu_dist.train.user_metric import MetricError, load_metrics

pytestmark = pytest.mark.timeout(60)


def _scores(n: int = 500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    s = rng.normal(size=n) * 2
    return s, (rng.random(n) < 1 / (1 + np.exp(-s + 0.5))).astype(np.float64)


def test_the_evaluation_figures_are_torchmetrics_auc_and_torchrec_s_ne_and_calibration():
    s, y = _scores()
    got = evaluate(s, y)
    p = torch.sigmoid(torch.from_numpy(s))
    t = torch.from_numpy(y)
    assert got["auc"] == float(binary_auroc(p, t.long()))
    logloss = float(torch.nn.functional.binary_cross_entropy(p, t))
    assert got["logloss"] == pytest.approx(logloss, rel=1e-12)
    ctr = float(t.mean())
    # torchrec.metrics.ne: cross entropy (log2) over the mean label's (log2): same ratio
    ce2 = float(-(t * torch.log2(p) + (1 - t) * torch.log2(1 - p)).sum())
    norm2 = -(t.sum() * math.log2(ctr) + (1 - t).sum() * math.log2(1 - ctr))
    assert got["ne"] == pytest.approx(ce2 / float(norm2), rel=1e-12)
    assert got["calibration"] == pytest.approx(float(p.sum() / t.sum()), rel=1e-12)
    assert got["ctr"] == ctr
    assert list(got) == ["auc", "logloss", "ne", "calibration", "ctr"]
    assert math.isnan(evaluate(s, np.zeros_like(y))["calibration"])  # no positive label


def _batch(n: int, start: int) -> Batch:
    rows = np.arange(start, start + n)
    return Batch(
        dense=rows[:, None].astype(np.float32),
        keys=np.zeros((n, 1), np.int64),
        labels=rows.astype(np.float32),
    )


def test_every_worker_count_puts_the_scores_back_in_the_data_s_order():
    batches = [_batch(7, 0), _batch(2, 7), _batch(5, 9)]  # a share may be empty at W = 3
    for world in (1, 2, 3):
        per_worker = [[share(b, r, world).labels for b in batches] for r in range(world)]
        assert in_data_order(per_worker).tolist() == list(range(14))


class _Comm:
    """Worker ``rank`` of a fake world whose gather hands worker 0 what the others sent."""

    def __init__(self, rank: int, box: dict[int, object]) -> None:
        self.rank, self.box = rank, box

    def gather(self, obj, root=0):
        self.box[self.rank] = obj
        if self.rank != root:
            return None
        return [self.box[r] for r in sorted(self.box)]


def test_train_auc_and_ne_are_over_the_window_and_the_same_for_any_worker_count():
    steps = [_scores(64, seed) for seed in range(5)]
    one = metrics.TrainScores(window=3)
    two = [metrics.TrainScores(window=3) for _ in range(2)]
    got1, got2 = [], []
    for t, (s, y) in enumerate(steps):
        one.add(s, y)
        for r, w in enumerate(two):
            w.add(s[32 * r : 32 * (r + 1)], y[32 * r : 32 * (r + 1)])
        if t in (1, 4):  # logged steps
            got1.append(one.figures(_Comm(0, {})))
            box: dict[int, object] = {}
            assert two[1].figures(_Comm(1, box)) == {}
            got2.append(two[0].figures(_Comm(0, box)))
    assert got1 == got2
    last = evaluate(
        np.concatenate([s for s, _ in steps[2:]]), np.concatenate([y for _, y in steps[2:]])
    )
    assert got1[1] == {"train_auc": last["auc"], "train_ne": last["ne"]}  # the last 3 steps


def test_each_logged_step_has_the_dense_and_every_table_s_rate():
    cfg = Config(
        job=JobConfig(worker_num=1, num_ps_ranks=1), train=TrainConfig(lr=0.2, lr_warmup_steps=10)
    )
    got = metrics.learning_rates(cfg, 4)
    table = cfg.tables.tables[0]
    assert got == {
        "lr": pytest.approx(0.2 * 5 / 10),
        f"lr_{table.name}": pytest.approx(table.lr * 5 / 10),
    }


# The user's metric, and two classes the flag must refuse.
USER_METRICS = (
    USER_METRIC
    + """

class Vector(MeanPrediction):
    def compute(self):
        return torch.stack([self.total, self.total])


class NotAMetric:
    pass
"""
)


def test_a_user_metric_from_a_file_is_loaded_tried_and_computed(tmp_path):
    path = tmp_path / "my_metrics.py"
    path.write_text(USER_METRICS)
    (metric,) = load_metrics([f"{path}:MeanPrediction"])
    assert metric.key == "mean_prediction"
    assert metric(np.array([0.25, 0.75, 0.5]), np.array([0, 1, 1])) == pytest.approx(0.5)
    for name, why in (
        ("Vector", "not one number"),
        ("NotAMetric", "not a subclass of torchmetrics.Metric"),
        ("Missing", "has no 'Missing'"),
    ):
        with pytest.raises(MetricError, match=why):
            load_metrics([f"{path}:{name}"])


def test_a_bad_metric_spec_is_named_before_anything_is_imported(tmp_path):
    assert "does not exist" in metric_spec_problem("no/such_file.py:Mine")
    assert "on the Python path" in metric_spec_problem("no_such_package.mod:Mine")
    assert "expected PKG.MODULE:CLASS" in metric_spec_problem("Mine")
    assert "built-in figure" in metric_spec_problem("torchmetrics:AUC")
    assert metric_spec_problem("torchmetrics:MeanMetric") is None
    assert metric_key("BinaryAUROC") == "binary_auroc"


def test_tensorboard_tags_are_grouped_and_phase_curves_are_per_step(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = tmp_path / "tb"
    with metrics.RunLog(None, tb) as log:
        # cumulative phase seconds: 10 ms per step for 5 steps, then 30 ms per step
        log.write({"step": 5, "loss": 0.5, "t_forward": 0.05, "bytes_pulled": 9, "lr": 0.1})
        log.write({"step": 10, "loss": 0.4, "t_forward": 0.2, "train_auc": 0.6, "lr_t": 0.2})
        log.write({"step": 10, "eval_auc": 0.7, "eval_ne": 0.9, "eval_mean_prediction": 0.3})
    events = EventAccumulator(str(tb))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert tags == {
        "train/loss", "phase_ms/forward", "ps/bytes_pulled", "lr/dense", "train/auc",
        "lr/table/t", "eval/auc", "eval/ne", "eval/mean_prediction",
    }  # fmt: skip
    phase = [(e.step, round(e.value, 9)) for e in events.Scalars("phase_ms/forward")]
    assert phase == [(5, 10.0), (10, 30.0)]


def test_the_summary_prints_the_main_figures_and_the_rest_when_verbose():
    totals = {"steps": 9, "samples_per_s": 1e3, "eval_auc": 0.7, "eval_ne": 0.9}
    totals |= {"rows_pushed": 5, "t_forward": 1.0, "tables": {"t": {"dim": 4, "rows": 3}}}
    short, full = summary.summary_table(totals), summary.summary_table(totals, verbose=True)
    assert "eval_ne" in short and "samples_per_s" in short and "forward" in short
    assert "rows_pushed" not in short and "rows_pushed" in full
    assert "blocks_ahead" not in short and "blocks_ahead" in full  # the per-table table


def test_without_a_terminal_progress_is_one_line_per_logged_step(capsys):
    bar = progress.Progress(30, 0, enabled=True, terminal=False)
    for step in range(1, 31):
        bar.update()
        if step % 10 == 0:
            bar.logged(step, 0.5, 1234.0)
    bar.close()
    out = capsys.readouterr()
    assert "\r" not in out.out + out.err
    assert out.out.splitlines() == [
        f"step {s}/30: loss 0.5000  1,234 samples/s (run average)" for s in (10, 20, 30)
    ]


def test_on_a_terminal_the_bar_shows_the_run_s_average_rate(capsys):
    bar = progress.Progress(30, 0, enabled=True, terminal=True)
    bar.logged(10, 0.5, 1234.0)
    bar.update()
    bar.close()
    err = capsys.readouterr().err
    assert "sps=1,234" in err and "it/s" not in err


def test_a_rank_under_mpirun_is_on_a_terminal_where_mpirun_s_stderr_is_one(tmp_path):
    def proc(pid: int, name: str, parent: int, stderr: str) -> None:
        d = tmp_path / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "stat").write_text(f"{pid} ({name}) S {parent} 1 1\n")
        os.symlink(stderr, d / "fd" / "2")

    proc(10, "python", 9, "pipe:[1]")
    proc(9, "mpirun", 8, "/dev/pts/3")
    proc(8, "bash", 1, "/dev/pts/3")
    not_tty = SimpleNamespace(isatty=lambda: False)
    assert progress.on_terminal(tmp_path, pid=10, stderr=not_tty)
    os.remove(tmp_path / "9" / "fd" / "2")
    os.symlink("/tmp/run.log", tmp_path / "9" / "fd" / "2")
    assert not progress.on_terminal(tmp_path, pid=10, stderr=not_tty)
    assert not progress.on_terminal(tmp_path, pid=77, stderr=not_tty)  # no such process
