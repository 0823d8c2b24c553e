"""The run's summary for a reader: the figures per table summed over the shards, the
workers' counters reduced, and the plain-text tables and the evaluation line printed at the
end (the JSON-lines log and TensorBoard are ``train.metrics``'s)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if not math.isfinite(v):
            return str(v)
        if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
            return f"{v:.4g}"
        return f"{v:,.4f}"
    return str(value)


def format_table(
    rows: list[tuple[Any, ...]] | list[list[Any]], headers: tuple[str, ...] | None = None
) -> str:
    """Plain-text table: first column left-aligned, the others right-aligned."""
    cells = [[_fmt(c) for c in r] for r in rows]
    if headers is not None:
        cells.insert(0, list(headers))
    if not cells:
        return ""
    ncol = max(len(r) for r in cells)
    cells = [r + [""] * (ncol - len(r)) for r in cells]
    widths = [max(len(r[i]) for r in cells) for i in range(ncol)]
    lines = []
    for n, r in enumerate(cells):
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
            ).rstrip()
        )
        if n == 0 and headers is not None:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


# Each table's figures in the summary's ``tables`` object (from each shard's Stats ``tables``).
TABLE_FIGURES = (
    "rows",
    "rows_dram",
    "rows_ssd",
    "rows_admitted",
    "rows_expired",
    "bytes",
    "blocks_ahead",
)
# What the workers count per table (TableTraffic), summed over them, beside the shards' figures.
TRAFFIC_FIGURES = ("ids_looked_up", "rows_read", "row_bytes_read")
# Worker 0's cache of each table (``--read-mode bagpipe``): its size in rows, its lookups, hits
# and hit rate.
CACHE_FIGURES = ("cache_rows", "cache_lookups", "cache_hits", "cache_hit_rate")


class TableTraffic:
    """Per table, what a worker's steps asked of it: ids looked up (every id of every bag),
    unique rows read (and, each step, written back: one gradient per row read) and those
    rows' float32 payload (``rows * dim * 4``; the wire's bytes, compressed or not, are the
    job-wide ``bytes_pulled`` / ``bytes_pushed``)."""

    def __init__(self, dims: Mapping[str, int]) -> None:
        self.dims = dict(dims)
        self.counts = {name: [0, 0] for name in self.dims}

    def add(self, plans: Mapping[str, tuple[Any, Any]]) -> None:
        """One step's plans: per table (unique ids, inverse)."""
        for name, (unique, inverse) in plans.items():
            c = self.counts[name]
            c[0] += len(inverse)
            c[1] += len(unique)

    @staticmethod
    def figures(
        everyone: Sequence[TableTraffic], dims: Mapping[str, int]
    ) -> dict[str, dict[str, int]]:
        """Every worker's counts summed, per table: :data:`TRAFFIC_FIGURES`."""
        out: dict[str, dict[str, int]] = {}
        for name, dim in dims.items():
            ids = sum(t.counts[name][0] for t in everyone)
            rows = sum(t.counts[name][1] for t in everyone)
            out[name] = {"ids_looked_up": ids, "rows_read": rows, "row_bytes_read": rows * dim * 4}
        return out


def per_table_figures(shard_stats: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """``{table: {"dim", "rows", "rows_dram", ...}}``: each table's figures summed over the
    shards, tables in name order (as the shards list them); empty when the shards report no
    tables."""
    out: dict[str, dict[str, int]] = {}
    for stats in shard_stats:
        for t in stats.get("tables", ()) or ():
            row = out.setdefault(
                str(t["name"]), {"dim": int(t.get("dim", 0)), **dict.fromkeys(TABLE_FIGURES, 0)}
            )
            for key in TABLE_FIGURES:
                row[key] += int(t.get(key, 0))
    return dict(sorted(out.items()))


def table_figures(shard_stats: Sequence[Mapping[str, Any]], tiered: bool, rules: bool) -> dict:
    """The PS tables at the end of a run, summed over shards: their rows, ``ps_apply_ms``
    (where commits applied: a step's apply on a shard, mean over the shards' applied steps
    since they started), and where the job set them, the tiers' split
    (``--ps-memory-rows``/``--ps-memory-bytes``/``--ps-ssd-dir``)
    and the step rules' counters (``--ps-admit-after``/``--ps-expire-after``); and ``tables``,
    each table's own figures (:func:`per_table_figures`), for every job."""
    names = ["rows"]
    if tiered:
        names += ["rows_dram", "rows_ssd", "ssd_bytes", "rows_read_ssd"]
    if rules:
        names += ["rows_admitted", "rows_expired", "pending_counts"]
    out: dict[str, Any] = {f"ps_{n}": sum(int(s.get(n, 0)) for s in shard_stats) for n in names}
    applied = sum(int(s.get("applied_steps", 0)) for s in shard_stats)
    if applied:  # a step's apply on a shard, mean ms (it overlaps the workers' dense phase)
        out["ps_apply_ms"] = sum(int(s.get("apply_ns", 0)) for s in shard_stats) / applied / 1e6
    tables = per_table_figures(shard_stats)
    if tables:
        out["tables"] = tables
    return out


def reduction(key: str) -> str:
    """How a per-worker counter is reduced over the workers: ``sum`` (counts and bytes:
    ``rows_*``, ``bytes_*``, ``reads_*``), ``max`` (``*_max``, ``*_wait_s``,
    ``exposed_sparse_s``: the slowest or worst worker is what bounds the job) or ``mean``
    (phase seconds ``t_*``, other seconds ``*_s``, ``*_mean``, ``*_rate``)."""
    if key.endswith(("_max", "_wait_s")) or key == "exposed_sparse_s":
        return "max"
    if key.startswith("t_") or key.endswith(("_s", "_mean", "_rate")):
        return "mean"
    return "sum"


def reduce_workers(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``<key>_<reduction>`` over every worker's record, for each number every worker
    reports (the summary's per-worker figures under their own names stay worker 0's)."""
    if not records:
        return {}
    out: dict[str, float] = {}
    for key in records[0]:
        values = [r.get(key) for r in records]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            continue
        how, nums = reduction(key), [v for v in values if v is not None]
        if how == "sum":
            out[f"{key}_sum"] = sum(nums)
        elif how == "max":
            out[f"{key}_max"] = max(nums)
        else:
            out[f"{key}_mean"] = sum(float(v) for v in nums) / len(nums)
    return out


# The summary's figures a user reads first (and every eval_* and test_* one): the rest are
# printed with --verbose-summary, and are all in the --metrics-out summary line either way.
HEADLINE = ("steps", "workers", "ps_shards", "seconds", "samples_per_s", "ps_rows")


def _headline(key: str) -> bool:
    return key in HEADLINE or key.startswith(("eval_", "test_"))


def summary_table(summary: Mapping[str, Any], verbose: bool = False) -> str:
    """The end-of-run summary: the figures (:data:`HEADLINE` and the evaluations' unless
    ``verbose``), then time per phase (``t_<phase>`` keys, worker 0's) with its share of all
    phase time; ``verbose`` adds every other figure and the per-table figures."""

    def phase(k: str) -> bool:
        return k.startswith("t_") and not k.endswith("_mean")

    plain = [
        (k, v)
        for k, v in summary.items()
        if not phase(k) and not isinstance(v, Mapping) and (verbose or _headline(k))
    ]
    phases = [(k[2:], float(v)) for k, v in summary.items() if phase(k)]
    out = [format_table(plain, ("metric", "value"))]
    tables = summary.get("tables")
    if verbose and isinstance(tables, Mapping) and tables:
        columns: tuple[str, ...] = ("dim", *TABLE_FIGURES)
        for extra in (TRAFFIC_FIGURES, CACHE_FIGURES):
            if any(k in t for t in tables.values() for k in extra):
                columns += extra
        rows = [(name, *(t.get(k, 0) for k in columns)) for name, t in tables.items()]
        out.append(format_table(rows, ("table", *columns)))
    if phases:
        total = sum(v for _, v in phases) or 1.0
        rows = [(name, secs, f"{100.0 * secs / total:.1f}%") for name, secs in phases]
        out.append(format_table(rows, ("phase", "seconds", "share")))
    return "\n\n".join(out)


def eval_line(step: int, result: Mapping[str, float]) -> str:
    """One evaluation on the console: ``step 100: eval_auc 0.7812  eval_logloss 0.4671``."""
    figures = "  ".join(
        f"{k} {v}" if isinstance(v, int) else f"{k} {v:.4f}" for k, v in result.items()
    )
    return f"step {step}: {figures}"
