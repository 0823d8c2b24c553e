"""JSON-lines log, evaluation metrics and the summary table."""

import json
import math

import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from cpu_dist.models.scoring import evaluate
from cpu_dist.train import metrics
from cpu_dist.train.metrics import (
    JsonLinesWriter,
    RunLog,
    format_table,
    read_summary,
    summary_table,
)

pytestmark = pytest.mark.timeout(30)


def test_jsonl_is_flushed_per_line_and_plain_json(tmp_path):
    path = tmp_path / "sub" / "run.jsonl"
    w = JsonLinesWriter(path)
    w.write(
        {
            "step": np.int64(10),
            "loss": np.float32(0.5),
            "t_pull": 0.25,
            "bad": float("nan"),
            "arr": np.arange(2),
        }
    )
    lines = path.read_text().splitlines()  # readable before close
    assert json.loads(lines[0]) == {
        "step": 10,
        "loss": 0.5,
        "t_pull": 0.25,
        "bad": None,
        "arr": [0, 1],
    }
    w.write({"step": 20, "eval_auc": 0.7})
    w.close()
    assert len(path.read_text().splitlines()) == 2
    with pytest.raises(ValueError):
        w.write({"step": 1})


def test_run_log_sinks_are_optional(tmp_path):
    with RunLog(None, None) as log:
        log.write({"step": 1, "loss": 0.1})  # writes nothing, fails nothing
    path = tmp_path / "m.jsonl"
    with RunLog(path, tmp_path / "tb") as log:
        log.write({"step": 1, "loss": 0.1})
        log.write({"summary": {"steps": 1}})
        assert log.tensorboard is not None  # works with or without tensorboard installed
    assert [json.loads(x) for x in path.read_text().splitlines()][1] == {"summary": {"steps": 1}}


def test_the_summary_is_read_back_as_written(tmp_path):
    path = tmp_path / "m.jsonl"
    with JsonLinesWriter(path) as w:
        w.write({"step": 1, "loss": 0.1, "note": "summary"})  # the word alone is no summary
        with pytest.raises(ValueError, match=r"m\.jsonl: no summary line"):
            read_summary(path)
        w.write({"summary": {"steps": 1, "eval_auc": 0.7}})
    assert read_summary(path) == {"steps": 1, "eval_auc": 0.7}


def test_evaluate_matches_scikit_learn():
    g = np.random.default_rng(0)
    y = (g.random(500) < 0.3).astype(np.float32)
    s = g.normal(size=500) + 1.5 * y
    got = evaluate(s, y)
    p = 1 / (1 + np.exp(-s))
    assert got["auc"] == pytest.approx(roc_auc_score(y, s))
    assert got["logloss"] == pytest.approx(log_loss(y, p))
    assert evaluate(np.array([-1.0, 2.0]), np.array([0, 1]))["auc"] == 1.0
    # Extreme logits do not overflow.
    assert math.isfinite(evaluate(np.array([-800.0, 800.0]), np.array([0, 1]))["logloss"])
    assert math.isnan(evaluate(np.array([0.1, 0.2]), np.array([1, 1]))["auc"])
    with pytest.raises(ValueError):
        evaluate(np.zeros(3), np.zeros(2))


def test_tables_are_aligned():
    text = format_table(
        [("loss", 0.123456), ("samples_per_s", 12345.6), ("steps", 200)], ("metric", "value")
    )
    lines = text.splitlines()
    assert lines[0].split() == ["metric", "value"] and set(lines[1].replace(" ", "")) == {"-"}
    assert len({len(x) for x in lines}) == 1, "right-aligned last column: equal widths"
    assert "12,345.6000" in text and "200" in text
    s = summary_table({"steps": 10, "seconds": 2.0, "t_pull": 1.0, "t_forward": 3.0})
    assert "pull" in s and "25.0%" in s and "75.0%" in s and "t_pull" not in s


def test_progress_can_be_silenced(capsys):
    bar = metrics.progress(3, enabled=False)
    bar.update(1)
    bar.set_postfix(loss="0.1")
    bar.close()
    assert capsys.readouterr().err == ""


def test_worker_figures_reduce_by_their_kind():
    w0 = {"bytes_pulled": 10, "rows_pushed": 3, "staleness_max": 1, "staleness_mean": 0.5}
    w0 |= {"commit_wait_s": 2.0, "exposed_sparse_s": 1.0, "t_forward": 4.0, "note": "x"}
    w1 = {"bytes_pulled": 30, "rows_pushed": 5, "staleness_max": 2, "staleness_mean": 1.5}
    w1 |= {"commit_wait_s": 1.0, "exposed_sparse_s": 3.0, "t_forward": 2.0, "note": "y"}
    got = metrics.reduce_workers([w0, w1])
    assert got == {
        "bytes_pulled_sum": 40,
        "rows_pushed_sum": 8,
        "staleness_max_max": 2,
        "staleness_mean_mean": 1.0,
        "commit_wait_s_max": 2.0,
        "exposed_sparse_s_max": 3.0,
        "t_forward_mean": 3.0,
    }
    assert metrics.reduce_workers([]) == {}


def test_the_phase_table_keeps_worker_0s_phases():
    text = summary_table({"steps": 2, "t_forward": 1.0, "t_forward_mean": 3.0})
    phase_rows = text.split("\n\n")[1]
    assert "forward" in phase_rows and "forward_mean" not in phase_rows
    assert "t_forward_mean" in text.split("\n\n")[0]


def test_the_summary_has_each_table_s_figures_summed_over_shards_beside_the_totals():
    def table(name, dim, rows, **more):
        return {
            "name": name,
            "dim": dim,
            "rows": rows,
            "rows_dram": rows,
            "bytes": 10 * rows,
            **more,
        }

    shards = [
        {"rows": 5, "tables": [table("a", 4, 2, rows_expired=1), table("b", 16, 3)]},
        {
            "rows": 7,
            "tables": [table("a", 4, 6, rows_admitted=2), table("b", 16, 1, blocks_ahead=3)],
        },
    ]
    got = metrics.table_figures(shards, tiered=False, rules=False)
    assert got["ps_rows"] == 12
    assert got["tables"] == {
        "a": {"dim": 4, "rows": 8, "rows_dram": 8, "rows_ssd": 0, "rows_admitted": 2,
              "rows_expired": 1, "bytes": 80, "blocks_ahead": 0},
        "b": {"dim": 16, "rows": 4, "rows_dram": 4, "rows_ssd": 0, "rows_admitted": 0,
              "rows_expired": 0, "bytes": 40, "blocks_ahead": 3},
    }  # fmt: skip
    printed = metrics.summary_table({"steps": 3, **got})
    assert "rows_admitted" in printed and printed.splitlines()[-1].split()[:3] == ["b", "16", "4"]
    assert "tables" not in metrics.table_figures([{"rows": 1}], tiered=False, rules=False)


def test_ps_apply_ms_is_the_mean_over_every_shard_s_applied_steps():
    shards = [
        {"rows": 1, "applied_steps": 10, "apply_ns": 30_000_000},
        {"rows": 1, "applied_steps": 30, "apply_ns": 10_000_000},
    ]
    got = metrics.table_figures(shards, tiered=False, rules=False)
    assert got["ps_apply_ms"] == 40_000_000 / 40 / 1e6  # 1.0: not the shards' means' mean (2.17)
    # no commit applied (pushes only, or an older shard without the fields): no figure
    assert "ps_apply_ms" not in metrics.table_figures([{"rows": 1}], tiered=False, rules=False)
