"""The cache stage (``--read-mode bagpipe``) as a step pipeline: one ``gpu_cache`` reader per
table of the job, run together.

A step's read plans every table at once (online: one id exchange for all tables; prescan:
each table's own plans), lets each table's cache serve its hits and staged rows, waits once
for the commit the remaining rows depend on, pulls them for every table in one request
(:class:`TableReads`) and then lets each cache admit and stage.  A step's gradients go out as
one commit of every table (``SparseCommitter.submit_tables``), with each cache's key union
(no id exchange) and its coherence callback, which runs once the step is handed over.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from cpu_dist.common.timing import PhaseTimer
from cpu_dist.sparse.aggregation import Outgoing, TableOutgoing
from cpu_dist.sparse.commits import SparseCommitter
from cpu_dist.sparse.reads import TableReads
from cpu_dist.train.pipelines.base import TableKeys, TableRows

if TYPE_CHECKING:
    from gpu_cache.controller import CachedRowReader
    from gpu_cache.plans import OnlineTablesPlanner


class CacheStage:
    """``readers``: each table's cache, in the job's table order; ``planner``: the online
    plans of every table at once (None: prescan, each reader plans from its own trace)."""

    prefetch_early = False  # the next step's plan needs the rows this step writes

    def __init__(
        self,
        readers: Mapping[str, CachedRowReader],
        reads: TableReads,
        committer: SparseCommitter,
        planner: OnlineTablesPlanner | None,
        phases: PhaseTimer | None = None,
    ) -> None:
        self.readers, self.reads, self.committer = dict(readers), reads, committer
        self.planner, self.phases = planner, phases
        self.timer = PhaseTimer()  # the stage's own share of the read (the joint demand pull)

    def read(self, step: int, unique: TableKeys) -> TableRows:
        with self.phases("pull") if self.phases is not None else contextlib.nullcontext():
            plans = self.planner.plan(step, unique) if self.planner is not None else {}
            pending = {n: r.begin(step, unique[n], plans.get(n)) for n, r in self.readers.items()}
            for name, reader in self.readers.items():
                reader.wait_dependency(pending[name])
            demand = {n: p.demand for n, p in pending.items() if len(p.demand_pos)}
            rows: dict[str, np.ndarray] = {}
            if demand:
                with self.timer("demand_pull"):
                    rows = self.reads.pull(demand)
            return {n: r.complete(pending[n], rows.get(n)) for n, r in self.readers.items()}

    def submit(self, step: int, keys: TableKeys, grads: TableKeys) -> None:
        unions: dict[str, np.ndarray] = {}
        coheres: dict[str, Callable[[Outgoing], None]] = {}
        for name, reader in self.readers.items():
            unions[name], coheres[name] = reader.prepare_submit(step, keys[name], grads[name])

        def cohere(out: TableOutgoing) -> None:
            for name, then in coheres.items():
                then(out[name])

        parts = {n: (keys[n], grads[n]) for n in self.readers}
        self.committer.submit_tables(step, parts, unions=unions, then=cohere)

    def prefetch(self, step: int, unique: TableKeys) -> None:
        """Nothing to do: prescan plans stage the next step's misses themselves."""

    def wait_readable(self, step: int) -> None:
        self.committer.wait_readable(step)

    def finish(self, last_step: int) -> None:
        self.committer.finish(last_step)
        for reader in self.readers.values():
            reader.close()

    def metrics(self) -> dict[str, float]:
        """Every table's cache figures summed (rates over the sums), the joint exchange's
        and pull's seconds."""
        out: dict[str, float] = {}
        for reader in self.readers.values():
            for key, value in reader.metrics().items():
                out[key] = out[key] + value if key in out else value  # (counts stay ints)
        out["cache_hit_rate"] = out.get("cache_hits", 0.0) / max(out.get("cache_lookups", 0.0), 1)
        if self.planner is not None:
            out["cache_id_exchange_s"] = self.planner.exchange_s
        for phase, seconds in self.timer.totals().items():
            key = f"cache_t_{phase}"
            out[key] = out.get(key, 0.0) + seconds
        return out

    def table_figures(self) -> dict[str, dict[str, float]]:
        """Per table, this worker's cache: ``summary.CACHE_FIGURES``."""
        out = {}
        for name, r in self.readers.items():
            lookups, hits = r.stats["lookups"], r.stats["hits"]
            out[name] = {
                "cache_rows": r.storage.capacity_rows,
                "cache_lookups": lookups,
                "cache_hits": hits,
                "cache_hit_rate": hits / max(lookups, 1),
            }
        return out
