#!/usr/bin/env python
"""The BagPipe cache stage: policy hit rates on a trace, then training with and without it.

(1) Trace replay: one worker's view (W=1, global batch 2048) of the synthetic id trace (Zipf
    1.05, default features), 200 steps.  At capacities of 1 %, 5 % and 10 % of the distinct
    rows, the hit rate (one hit per unique key per step) of the online policy (LRU), of the
    prescan policy (next-use scores with gated admission: the code the controller runs) and of
    Belady's optimal policy, computed here offline on the same trace.
(2) Training at W=2 (+1 PS) with a cache of 5 % of the run's distinct rows against uncached
    training in the same invocation: prescan with collective aggregation and with ps
    aggregation, each against the uncached run with the same aggregation (--repeats
    interleaved pairs; the ratios are medians over the pairs).  Bytes pulled from
    the PS, seconds per step exposed to sparse traffic (pull + commit waits + push, which holds
    the cache's coherence work), samples/s.
The last line is one JSON object (prescan_vs_belady_5pct, bytes_saved_5pct,
sparse_time_saved_5pct, speedup_5pct: the headline figures are prescan + collective;
pull_bytes_over_misses_5pct: the cached run's bytes pulled over its misses x row bytes, 1.0
when it pulls nothing but its misses; training.*.bytes_pulled: each pair's absolute bytes).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cpu_dist.common.config import ModelConfig  # noqa: E402
from cpu_dist.data import make_dataset  # noqa: E402
from cpu_dist.testing.jobs import measured_flags, run_job  # noqa: E402
from cpu_dist.train.metrics import read_summary  # noqa: E402
from gpu_cache import fused_trace  # noqa: E402
from gpu_cache._metadata import BagPipeCacheMetadata  # noqa: E402
from gpu_cache.controller import admit_misses  # noqa: E402
from gpu_cache.plans import FAR, PrescanPlanner  # noqa: E402
from gpu_cache.storage import ROWS_PER_UNIT  # noqa: E402

# Bytes of one pulled row: the jobs run here use the default width, float32 rows.
ROW_BYTES = ModelConfig.embedding_dim * 4


class OneRank:
    def Get_size(self):
        return 1

    def Get_rank(self):
        return 0


def policy_hit_rate(plans, capacity: int, prescan: bool) -> float:
    meta = BagPipeCacheMetadata(capacity)
    hits = total = 0
    for p in plans:
        scores = p.scores if prescan else None
        pos, _ = meta.query(p.keys, scores)
        miss = np.ones(len(p.keys), dtype=bool)
        miss[pos] = False
        admit_misses(meta, p.keys[miss], None if scores is None else scores[miss], capacity)
        hits += len(pos)
        total += len(p.keys)
    return hits / total


def belady_hit_rate(plans, capacity: int) -> float:
    """Offline optimum for step-granular requests: after each step keep the ``capacity`` rows
    of (resident | requested) whose next use is soonest (rows never used again are dropped)."""
    res_keys = np.zeros(0, dtype=np.int64)
    res_next = np.zeros(0, dtype=np.int64)
    hits = total = 0
    for p in plans:
        hits += int(np.isin(p.keys, res_keys, assume_unique=True).sum())
        total += len(p.keys)
        nxt = np.where(p.scores == FAR, np.iinfo(np.int64).max, -p.scores)
        keep_old = ~np.isin(res_keys, p.keys, assume_unique=True)
        keys = np.concatenate([res_keys[keep_old], p.keys])
        nexts = np.concatenate([res_next[keep_old], nxt])
        alive = nexts != np.iinfo(np.int64).max
        keys, nexts = keys[alive], nexts[alive]
        if len(keys) > capacity:
            idx = np.argpartition(nexts, capacity - 1)[:capacity]
            keys, nexts = keys[idx], nexts[idx]
        res_keys, res_next = keys, nexts
    return hits / total


def trace_part(args) -> dict:
    t0 = time.perf_counter()
    ds = make_dataset("synthetic", seed=0, zipf_exponent=1.05)
    trace = list(fused_trace(ds, args.batch_size, args.trace_steps, 0, 1))
    planner = PrescanPlanner(OneRank(), trace)
    distinct = len(np.unique(np.concatenate(trace)))
    out = {"trace_distinct_rows": distinct, "trace_steps": args.trace_steps}
    for pct in (1, 5, 10):
        cap = max(1, math.ceil(distinct * pct / 100 / ROWS_PER_UNIT)) * ROWS_PER_UNIT
        r = {
            "online": policy_hit_rate(planner.plans, cap, False),
            "prescan": policy_hit_rate(planner.plans, cap, True),
            "belady": belady_hit_rate(planner.plans, cap),
        }
        out[f"hit_rate_{pct}pct"] = {k: round(v, 4) for k, v in r.items()}
        print(f"capacity {pct}% ({cap} rows): " + json.dumps(out[f"hit_rate_{pct}pct"]), flush=True)
    print(f"trace part: {time.perf_counter() - t0:.1f}s", flush=True)
    return out


def run(args, name: str, extra: list[str]) -> dict:
    out = Path(tempfile.mkdtemp()) / f"{name}.jsonl"
    flags = measured_flags(args.batch_size, args.steps, out)
    run_job(name, 3, ["--worker-num", "2", *flags, "--lr", "0.1", *extra], timeout_s=1800)
    s = read_summary(out)
    steps = s["steps"]
    exposed = (s.get("t_pull", 0) + s.get("t_commit_wait", 0) + s.get("t_push", 0)) / steps
    r = {
        "samples_per_s": s["samples_per_s"],
        "bytes_pulled": s["bytes_pulled"],
        "exposed_sparse_s_per_step": exposed,
        **{k: v for k, v in s.items() if k.startswith(("cache_", "prescan_"))},
    }
    print(name, json.dumps(r), flush=True)
    return r


def training_part(args) -> dict:
    ds = make_dataset("synthetic", seed=0, zipf_exponent=1.05)
    distinct = len(
        np.unique(np.concatenate(list(fused_trace(ds, args.batch_size, args.steps, 0, 1))))
    )
    units = max(1, math.ceil(distinct * 0.05 / ROWS_PER_UNIT))
    cache = [
        "--ps-type",
        "RDMA",
        "--read-mode",
        "bagpipe",
        "--optimization-prescan",
        "--optimization-cache-capacity",
        str(units),
    ]
    out = {"train_distinct_rows": distinct, "cache_units_5pct": units, "repeats": args.repeats}
    for agg in ("collective", "ps"):
        # Interleaved pairs (uncached, cached): a shared, noisy machine drifts between runs, so
        # each ratio compares neighbours and the figures are medians over the pairs.
        pairs = []
        for _ in range(args.repeats):
            plain = run(args, f"uncached_{agg}", ["--aggregation", agg])
            cached = run(args, f"prescan_{agg}", [*cache, "--bagpipe-aggregation", agg])
            pairs.append((plain, cached))
        med = lambda f: float(np.median([f(p, c) for p, c in pairs]))  # noqa: E731
        plain, cached = pairs[-1]
        out[agg] = {
            "bytes_saved": med(lambda p, c: 1 - c["bytes_pulled"] / p["bytes_pulled"]),
            "sparse_time_saved": med(
                lambda p, c: 1 - c["exposed_sparse_s_per_step"] / p["exposed_sparse_s_per_step"]
            ),
            "speedup": med(lambda p, c: c["samples_per_s"] / p["samples_per_s"]),
            "hit_rate": cached.get("cache_hit_rate"),
            "samples_per_s": [
                [round(p["samples_per_s"], 1), round(c["samples_per_s"], 1)] for p, c in pairs
            ],
            "exposed_sparse_ms_per_step": [
                [
                    round(1e3 * p["exposed_sparse_s_per_step"], 2),
                    round(1e3 * c["exposed_sparse_s_per_step"], 2),
                ]
                for p, c in pairs
            ],
            "prescan_startup_s": cached.get("prescan_startup_s"),
            # What the cached run pulled over what its misses need (one row each): 1.0 when
            # it pulls nothing but its misses.
            "pull_bytes_over_misses": cached["bytes_pulled"]
            / max(1, (cached["cache_lookups"] - cached["cache_hits"]) * ROW_BYTES),
            "bytes_pulled": [[p["bytes_pulled"], c["bytes_pulled"]] for p, c in pairs],
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trace-steps", type=int, default=200)
    p.add_argument("--steps", type=int, default=60, help="training steps of part (2)")
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="interleaved (uncached, cached) pairs per aggregation; medians reported",
    )
    p.add_argument("--skip-training", action="store_true")
    args = p.parse_args()
    trace = trace_part(args)
    line = {
        "prescan_vs_belady_5pct": round(
            trace["hit_rate_5pct"]["prescan"] / trace["hit_rate_5pct"]["belady"], 4
        ),
        "online_vs_belady_5pct": round(
            trace["hit_rate_5pct"]["online"] / trace["hit_rate_5pct"]["belady"], 4
        ),
        **trace,
    }
    if not args.skip_training:
        train = training_part(args)
        head = train["collective"]
        line.update(
            bytes_saved_5pct=round(head["bytes_saved"], 4),
            sparse_time_saved_5pct=round(head["sparse_time_saved"], 4),
            speedup_5pct=round(head["speedup"], 4),
            bytes_saved_5pct_ps=round(train["ps"]["bytes_saved"], 4),
            sparse_time_saved_5pct_ps=round(train["ps"]["sparse_time_saved"], 4),
            speedup_5pct_ps=round(train["ps"]["speedup"], 4),
            pull_bytes_over_misses_5pct=round(head["pull_bytes_over_misses"], 4),
            pull_bytes_over_misses_5pct_ps=round(train["ps"]["pull_bytes_over_misses"], 4),
            training=train,
        )
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
