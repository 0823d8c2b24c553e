"""JSON-lines log, evaluation metrics and the summary table."""

import json
import math
import os
from types import SimpleNamespace
from unittest.mock import patch

import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from cpu_dist.common.files import OutputError
from cpu_dist.common.metrics_log import header
from cpu_dist.models.scoring import evaluate
from cpu_dist.train import metrics, progress, summary
from cpu_dist.train.metrics import JsonLinesWriter, RunLog, read_summary
from cpu_dist.train.summary import format_table, summary_table

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
    bar = progress.progress(3, enabled=False)
    bar.update(1)
    bar.set_postfix(loss="0.1")
    bar.close()
    assert capsys.readouterr().err == ""


def test_worker_figures_reduce_by_their_kind():
    w0 = {"bytes_pulled": 10, "rows_pushed": 3, "staleness_max": 1, "staleness_mean": 0.5}
    w0 |= {"commit_wait_s": 2.0, "exposed_sparse_s": 1.0, "t_forward": 4.0, "note": "x"}
    w1 = {"bytes_pulled": 30, "rows_pushed": 5, "staleness_max": 2, "staleness_mean": 1.5}
    w1 |= {"commit_wait_s": 1.0, "exposed_sparse_s": 3.0, "t_forward": 2.0, "note": "y"}
    got = summary.reduce_workers([w0, w1])
    assert got == {
        "bytes_pulled_sum": 40,
        "rows_pushed_sum": 8,
        "staleness_max_max": 2,
        "staleness_mean_mean": 1.0,
        "commit_wait_s_max": 2.0,
        "exposed_sparse_s_max": 3.0,
        "t_forward_mean": 3.0,
    }
    assert summary.reduce_workers([]) == {}


def test_the_phase_table_keeps_worker_0s_phases():
    text = summary_table({"steps": 2, "t_forward": 1.0, "t_forward_mean": 3.0}, verbose=True)
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
    got = summary.table_figures(shards, tiered=False, rules=False)
    assert got["ps_rows"] == 12
    assert got["tables"] == {
        "a": {"dim": 4, "rows": 8, "rows_dram": 8, "rows_ssd": 0, "rows_admitted": 2,
              "rows_expired": 1, "bytes": 80, "blocks_ahead": 0},
        "b": {"dim": 16, "rows": 4, "rows_dram": 4, "rows_ssd": 0, "rows_admitted": 0,
              "rows_expired": 0, "bytes": 40, "blocks_ahead": 3},
    }  # fmt: skip
    printed = summary.summary_table({"steps": 3, **got}, verbose=True)
    assert "rows_admitted" in printed and printed.splitlines()[-1].split()[:3] == ["b", "16", "4"]
    assert "tables" not in summary.table_figures([{"rows": 1}], tiered=False, rules=False)


def test_ps_apply_ms_is_the_mean_over_every_shard_s_applied_steps():
    shards = [
        {"rows": 1, "applied_steps": 10, "apply_ns": 30_000_000},
        {"rows": 1, "applied_steps": 30, "apply_ns": 10_000_000},
    ]
    got = summary.table_figures(shards, tiered=False, rules=False)
    assert got["ps_apply_ms"] == 40_000_000 / 40 / 1e6  # 1.0: not the shards' means' mean (2.17)
    # no commit applied (pushes only, or an older shard without the fields): no figure
    assert "ps_apply_ms" not in summary.table_figures([{"rows": 1}], tiered=False, rules=False)


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _old_log(path, run: str | None) -> str:
    """A log of ``run`` (None: of an older version, no header) that ran 12 steps."""
    records = [
        *([header(run)] if run is not None else []),
        {"step": 5, "loss": 0.5},
        {"step": 10, "loss": 0.4},
        {"step": 10, "eval_auc": 0.6},
        {"step": 12, "loss": 0.3},
        {"step": 12, "eval_auc": 0.7},
        {"summary": {"steps": 12}},
    ]
    text = "".join(json.dumps(r) + "\n" for r in records)
    path.write_text(text)
    return text


def test_a_fresh_log_replaces_an_old_one_only_at_its_first_record(tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    old = _old_log(path, "before")
    with RunLog(path, run_id="new"):  # a job that fails before its first record
        pass
    assert path.read_text() == old
    log = RunLog(path, run_id="new")
    monkeypatch.setattr(metrics.os, "replace", _fail)  # a crash during the rewrite
    with pytest.raises(OSError, match="disk gone"):
        log.write({"step": 1, "loss": 0.9})
    monkeypatch.undo()
    assert path.read_text() == old and sorted(tmp_path.iterdir()) == [path]  # no temp left
    with RunLog(path, run_id="new") as log:
        log.write({"step": 1, "loss": 0.9})
        log.write({"step": 2, "loss": 0.8})
    assert _lines(path) == [
        {"cpu_dist_log": 1, "run": "new"},
        {"step": 1, "loss": 0.9},
        {"step": 2, "loss": 0.8},
    ]


def test_a_log_given_as_a_link_is_written_where_the_link_points(tmp_path):
    """``latest.jsonl -> runs/42/m.jsonl``: the run's log replaces the target, and the link
    stays a link (os.replace over the link would have made it a file of its own)."""
    target = tmp_path / "runs" / "42" / "m.jsonl"
    target.parent.mkdir(parents=True)
    link = tmp_path / "latest.jsonl"
    link.symlink_to(target)
    with RunLog(link, run_id="r") as log:
        log.write({"step": 1, "loss": 0.5})
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert _lines(target) == [{"cpu_dist_log": 1, "run": "r"}, {"step": 1, "loss": 0.5}]


def _fail(*_args: object) -> None:
    raise OSError("disk gone")


@pytest.mark.parametrize("run", ["r1", None])
def test_a_resumed_log_keeps_its_lines_up_to_the_checkpoint_and_appends(tmp_path, run):
    """Resumed after 10 steps: the lines of steps 11 and 12 and the summary are dropped (the
    run does those steps again), the rest kept as written; a header-less log (an older
    version's) is taken and gets the run's header."""
    path = tmp_path / "m.jsonl"
    old = _old_log(path, run)
    with RunLog(path, run_id="r1", resume_at=10):
        pass
    assert path.read_text() == old  # untouched until the first record
    with RunLog(path, run_id="r1", resume_at=10) as log:
        log.write({"step": 11, "loss": 0.35})
        log.write({"summary": {"steps": 11}})
    got = _lines(path)
    assert got[0] == {"cpu_dist_log": 1, "run": "r1"}
    assert [(r.get("step"), "loss" in r) for r in got[1:-1]] == [
        (5, True),
        (10, True),
        (10, False),
        (11, True),
    ]
    assert got[-1] == {"summary": {"steps": 11}}
    kept = [x for x in old.splitlines() if '"cpu_dist_log"' not in x][:3]
    assert path.read_text().splitlines()[1:4] == kept  # byte for byte


def test_a_resume_refuses_another_runs_log_naming_the_flag_file_and_runs(tmp_path):
    path = tmp_path / "m.jsonl"
    old = _old_log(path, "other")
    want = rf"--metrics-out {path}: is the log of run other, not of run mine"
    with pytest.raises(OutputError, match=want):
        RunLog(path, run_id="mine", resume_at=10)
    ck = SimpleNamespace(resume=True, dir=str(tmp_path / "ck"))
    cfg = SimpleNamespace(output=SimpleNamespace(metrics_out=str(path)), checkpoint=ck)
    latest = SimpleNamespace(run_id="mine")
    with patch("cpu_dist.checkpoint.manifest.find_latest", return_value=latest):
        with pytest.raises(OutputError, match=want):
            metrics.check_resume_log(cfg)  # the preflight's check, before anything starts
        latest.run_id = "other"
        metrics.check_resume_log(cfg)
    assert path.read_text() == old
    path.write_text('{"step": 1}\n{"step": 2, "lo\n')
    with pytest.raises(OutputError, match=rf"--metrics-out {path}:2: not JSON"):
        RunLog(path, run_id="mine", resume_at=10)


def test_a_resumed_tensorboard_run_drops_its_events_past_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = tmp_path / "tb"
    with RunLog(None, tb) as log:
        for step in range(1, 11):
            log.write({"step": step, "loss": float(step)})
    with RunLog(None, tb, run_id="r", resume_at=5) as log:
        for step in range(6, 9):
            log.write({"step": step, "loss": 100.0 + step})
    events = EventAccumulator(str(tb))
    events.Reload()
    got = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert got == [(s, float(s)) for s in range(1, 6)] + [(s, 100.0 + s) for s in range(6, 9)]


def test_a_record_appended_to_a_new_log_follows_a_header(tmp_path):
    path = tmp_path / "m.jsonl"
    metrics.append_record(path, {"summary": {"steps": 3}}, run_id="ref")
    metrics.append_record(path, {"summary": {"steps": 4}}, run_id="ref2")
    assert _lines(path) == [
        {"cpu_dist_log": 1, "run": "ref"},
        {"summary": {"steps": 3}},
        {"summary": {"steps": 4}},
    ]
    assert read_summary(path) == {"steps": 4}
