"""scripts/plot_metrics.py: a PNG from a run's JSON lines, clear errors otherwise."""

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "plot_metrics.py"


@pytest.fixture(scope="module")
def plot_metrics():
    spec = importlib.util.spec_from_file_location("plot_metrics", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run_file(tmp_path: Path) -> Path:
    recs: list[dict] = [{"cpu_dist_log": 1, "run": "r"}]  # the header: not a record
    for step in (10, 20, 30):
        recs.append(
            {
                "step": step,
                "loss": 0.7 - step / 100,
                "samples_per_s": 1000.0 + step,
                "t_pull": 0.1 * step,
                "t_forward": 0.2 * step,
                "bytes_pulled": 10 * step,
            }
        )
        if step % 20 == 0:
            recs.append({"step": step, "eval_auc": 0.6, "eval_logloss": 0.5})
    recs.append({"summary": {"steps": 30}})
    p = tmp_path / "run.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


def test_writes_a_png(tmp_path, plot_metrics, capsys):
    out = tmp_path / "run.png"
    assert plot_metrics.main([str(_run_file(tmp_path)), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_phase_rates_are_per_step_differences(tmp_path, plot_metrics):
    steps, evals = plot_metrics.read_metrics(_run_file(tmp_path))
    assert len(steps) == 3 and len(evals) == 1
    xs, rates = plot_metrics.phase_rates(steps)
    assert xs == [10, 20, 30]
    assert rates["pull"] == pytest.approx([0.1, 0.1, 0.1])
    assert rates["forward"] == pytest.approx([0.2, 0.2, 0.2])


@pytest.mark.parametrize(
    "content,needle", [(None, "no such file"), ("", "empty"), ("{oops\n", "not JSON")]
)
def test_missing_empty_or_broken_file_is_a_clear_error(
    tmp_path, plot_metrics, capsys, content, needle
):
    p = tmp_path / "m.jsonl"
    if content is not None:
        p.write_text(content)
    assert plot_metrics.main([str(p), "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert needle in err and str(p) in err
    assert not (tmp_path / "x.png").exists()
