#!/usr/bin/env python3
"""Plot a run's JSON-lines metrics to a PNG: loss, eval AUC, samples/s, time per phase.

    python scripts/plot_metrics.py RUN.jsonl -o OUT.png

Reads the layout of cpu_dist/train/metrics.py (through cpu_dist.common.metrics_log, which
skips the log's header line): step lines carry "loss" (and "samples_per_s", "t_<phase>"
cumulative seconds), eval lines carry "eval_auc", a final line "summary". The phase panel
shows seconds per step in each window between logged steps, stacked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cpu_dist.common.metrics_log import MetricsLogError, read_records


class MetricsFileError(ValueError):
    """The metrics file is missing, empty or not JSON lines."""


def read_metrics(path: str | Path) -> tuple[list[dict], list[dict]]:
    """(step lines, eval lines) of a JSON-lines metrics file."""
    p = Path(path)
    if not p.is_file():
        raise MetricsFileError(f"{p}: no such file")
    steps, evals = [], []
    try:
        records = read_records(p)
    except MetricsLogError as e:
        raise MetricsFileError(str(e)) from None
    for rec in records:
        if "loss" in rec and "step" in rec:
            steps.append(rec)
        elif "eval_auc" in rec and "step" in rec:
            evals.append(rec)
    if not steps and not evals:
        raise MetricsFileError(f"{p}: no step or eval lines (empty file?)")
    return steps, evals


def phase_rates(steps: list[dict]) -> tuple[list[float], dict[str, list[float]]]:
    """Per-window seconds per step of each phase from the cumulative ``t_<phase>`` values."""
    names: list[str] = []
    for rec in steps:
        names += [k for k in rec if k.startswith("t_") and k not in names]
    xs: list[float] = []
    out: dict[str, list[float]] = {k[2:]: [] for k in names}
    prev_step, prev = 0, dict.fromkeys(names, 0.0)
    for rec in steps:
        n = rec["step"] - prev_step
        if n <= 0:
            continue
        xs.append(rec["step"])
        for k in names:
            cur = float(rec.get(k) or 0.0)
            out[k[2:]].append(max(cur - prev[k], 0.0) / n)
            prev[k] = cur
        prev_step = rec["step"]
    return xs, out


def plot(steps: list[dict], evals: list[dict], out: str | Path, title: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    (a_loss, a_auc), (a_sps, a_phase) = ax

    a_loss.plot([r["step"] for r in steps], [r["loss"] for r in steps], color="tab:blue")
    a_loss.set(title="training loss", xlabel="step", ylabel="BCE loss")

    ev = [r for r in evals if r.get("eval_auc") is not None]
    a_auc.plot([r["step"] for r in ev], [r["eval_auc"] for r in ev], marker="o", color="tab:green")
    a_auc.set(title="held-out AUC", xlabel="step", ylabel="AUC")

    sps = [r for r in steps if r.get("samples_per_s") is not None]
    a_sps.plot([r["step"] for r in sps], [r["samples_per_s"] for r in sps], color="tab:orange")
    a_sps.set(title="throughput", xlabel="step", ylabel="samples/s")

    xs, phases = phase_rates(steps)
    if xs and phases:
        a_phase.stackplot(xs, *phases.values(), labels=list(phases))
        a_phase.legend(loc="upper left", fontsize="small", ncol=2)
    a_phase.set(title="time per step by phase", xlabel="step", ylabel="seconds")

    for a in ax.flat:
        a.grid(alpha=0.3)
        if not a.has_data():
            a.text(0.5, 0.5, "no data", ha="center", va="center", transform=a.transAxes)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", help="JSON-lines metrics file of a run (--metrics-out)")
    parser.add_argument("-o", "--output", required=True, help="PNG file to write")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    try:
        steps, evals = read_metrics(args.metrics)
    except MetricsFileError as e:
        print(f"plot_metrics: {e}", file=sys.stderr)
        return 2
    plot(steps, evals, args.output, args.title or Path(args.metrics).name)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
