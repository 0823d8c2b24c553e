#!/usr/bin/env python
"""What --ps-compression costs in model quality and saves in bytes, in one run.

The default job (2 workers, 1 PS shard, default DLRM on the synthetic stream, 300 steps) for
every compression (none, fp16, int8) and every --seed given; per run the summary's eval AUC
and training bytes (bytes_pulled + bytes_pushed: evaluation reads are float32 on a client
of their own and not counted).  The last line is one JSON object: per mode the AUCs, their
difference from float32's on the same seed (auc_delta_<mode>), the mean of those differences
with its standard error over the seeds, and the bytes ratio to float32 (targets: int8 <= 0.3;
AUC within 0.002 of float32's).

A control, ``float64``: the same job uncompressed with the dense layers in float64
(``--dtype float64``; rows stay float32).  It changes nothing but rounding, and in the more
exact direction, so its AUC difference is what rounding alone moves this metric by.  The
default job's 300-step AUC is chaotic in its rounding (measured: dense float64 moved seed 0 by
-0.030 and seed 2 by +0.013), so a codec's difference on one seed says little; the mean over
seeds, next to the control's spread, is what compares them.

    .venv/bin/python scripts/bench_compression.py [--seeds 0 1 2] [--steps 300]
        [--modes none fp16 int8 float64]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cpu_dist.testing.jobs import run_job  # noqa: E402
from cpu_dist.train.metrics import read_summary  # noqa: E402

# mode -> the job's extra flags; "none" is the float32 baseline every delta is taken against.
MODES: dict[str, list[str]] = {
    "none": ["--ps-compression", "none"],
    "fp16": ["--ps-compression", "fp16"],
    "int8": ["--ps-compression", "int8"],
    "float64": ["--ps-compression", "none", "--dtype", "float64"],
}


def run(mode: str, seed: int, steps: int, tmp: Path) -> dict:
    out = tmp / f"{mode}-{seed}.jsonl"
    args = ["--worker-num", "2", *MODES[mode], "--seed", str(seed), "--max_step", str(steps)]
    args += ["--no-progress", "--test-batches", "0", "--metrics-out", str(out)]
    run_job(f"{mode} seed {seed}", 3, args)
    s = read_summary(out)
    r = {"auc": s["eval_auc"], "bytes": s["bytes_pulled"] + s["bytes_pushed"]}
    print(mode, seed, json.dumps(r), flush=True)
    return r


def mean_and_se(xs: list[float]) -> tuple[float, float | None]:
    """Mean, and its standard error (sample standard deviation / sqrt(n); None for n = 1)."""
    m = statistics.fmean(xs)
    return m, statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else None


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--modes", nargs="+", choices=sorted(MODES), default=list(MODES))
    args = p.parse_args()
    modes = ["none", *(m for m in MODES if m in args.modes and m != "none")]
    with tempfile.TemporaryDirectory() as tmp:
        res = {(m, s): run(m, s, args.steps, Path(tmp)) for s in args.seeds for m in modes}
    line: dict[str, object] = {"steps": args.steps, "seeds": args.seeds}
    for m in modes:
        line[f"auc_{m}"] = [round(res[m, s]["auc"], 5) for s in args.seeds]
        if m == "none":
            continue
        deltas = [res[m, s]["auc"] - res["none", s]["auc"] for s in args.seeds]
        mean, se = mean_and_se(deltas)
        line[f"auc_delta_{m}"] = [round(d, 5) for d in deltas]
        line[f"auc_delta_{m}_mean"] = round(mean, 5)
        line[f"auc_delta_{m}_se"] = None if se is None else round(se, 5)
        if m != "float64":  # the control moves float32 bytes
            ratios = [res[m, s]["bytes"] / res["none", s]["bytes"] for s in args.seeds]
            line[f"bytes_{m}_vs_none"] = round(max(ratios), 4)
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
