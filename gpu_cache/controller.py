"""CachedRowReader: the cache stage between the worker loop and the PS.

Per step ``read(step, keys)``: plan (online id exchange or prescan lookup) -> metadata query
-> gather hits -> take the rows staged for this step -> pull what is still missing once the
commit it depends on is applied -> admit a bounded set of misses into the cache -> in prescan
mode, stage the next step's misses (pulled in the background while forward/backward run).
``submit`` hands the step's gradients to the commit protocol and keeps the cache and the staged
rows coherent with the PS (coherence.py).

Staged rows are the next step's misses, pulled after commit ``step - 1`` and before this worker
submits ``step`` (so before commit ``step`` can be applied: it needs this worker's markers).
They then follow the same coherence rule as resident rows: ``submit(step)`` applies the
step's update to them where the worker knows it exactly (every row in ``collective``
aggregation; rows only this worker touched in ``ps``).  Rows whose update it cannot know are
not staged; they are read on demand after commit ``step``.  So the next step reads every row it
can without waiting for any commit.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from cpu_dist.common.schedule import CONSTANT, LrSchedule
from cpu_dist.common.sorted_keys import find_sorted
from cpu_dist.common.timing import PhaseTimer
from cpu_dist.sparse.aggregation import Outgoing
from cpu_dist.sparse.reads import pull_when_applied
from gpu_cache import coherence
from gpu_cache._metadata import BagPipeCacheMetadata
from gpu_cache.bypass import LowHitBypass
from gpu_cache.plans import OnlinePlanner, PrescanPlanner, StepPlan
from gpu_cache.storage import RowStorage


def admit_misses(meta, keys: np.ndarray, scores: np.ndarray | None, max_admit: int):
    """The admission policy of both modes: ``(slots, source positions in keys, evicted)``.

    Online (no scores): sequential LRU of at most ``max_admit`` misses.  Prescan: soonest next use
    first, and a row needed later never displaces one needed sooner (Belady in the window).
    """
    if not len(keys):
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    return meta.admit(keys, scores, max_admit, scores is not None)


@dataclass
class StagedRows:
    """Rows of ``step``'s misses pulled ahead of time: ``pos`` in that step's keys."""

    step: int
    pos: np.ndarray
    keys: np.ndarray
    future: cf.Future
    rows: np.ndarray | None = None  # set by submit(step - 1), then kept coherent


@dataclass
class PendingRead:
    """A read between :meth:`CachedRowReader.begin` and :meth:`CachedRowReader.complete`."""

    step: int
    plan: StepPlan
    keys: np.ndarray
    out: np.ndarray  # the rows of keys, hits and staged rows filled in
    miss_pos: np.ndarray  # positions in keys that missed the cache (admission candidates)
    demand_pos: np.ndarray  # the misses nothing staged: read from the PS
    admit: bool  # the low-hit bypass lets misses in
    dependency: int  # the last step whose commit changed a demand row (-1: none)

    @property
    def demand(self) -> np.ndarray:
        return self.keys[self.demand_pos]


class Commits(Protocol):
    """What the cache needs from the commit protocol (``cpu_dist.sparse.commits``)."""

    @property
    def committed(self) -> int: ...

    def submit(
        self,
        step: int,
        keys: np.ndarray,
        grads: np.ndarray,
        union: np.ndarray | None = None,
        then: Callable[[Outgoing], None] | None = None,
    ) -> Outgoing: ...

    def drain(self) -> None: ...

    def wait_readable(self, step: int) -> None: ...

    def wait_applied(self, step: int) -> None: ...

    def finish(self, last_step: int) -> None: ...


class CachedRowReader:
    """One table's cache: its rows, metadata, plans and staging.  ``CacheStage``
    (``cpu_dist/train/pipelines/cache.py``) runs one per table of the job as a step pipeline
    (one demand pull and one commit for all of them)."""

    prefetch_early = False  # its prefetch plans from the rows the last step wrote

    def __init__(
        self,
        client,
        committer: Commits,
        planner: OnlinePlanner | PrescanPlanner,
        *,
        dim: int,
        capacity_units: int,
        lr: float,
        aggregation: str,
        world: int,
        device=None,
        bypass: LowHitBypass | None = None,
        phases: PhaseTimer | None = None,
        schedule: LrSchedule = CONSTANT,
    ) -> None:
        self.client, self.committer, self.planner = client, committer, planner
        self.storage = RowStorage(capacity_units, dim, device)
        self.meta = BagPipeCacheMetadata(self.storage.capacity_rows)
        self.lr, self.aggregation, self.world, self.dim = float(lr), aggregation, world, dim
        self.schedule = schedule  # step t's copies take step t's rate, as its commit
        self._plan: StepPlan | None = None
        self.bypass = bypass if bypass is not None else LowHitBypass(0.0)
        self._pool = cf.ThreadPoolExecutor(1) if planner.prescan else None  # staging
        self._staged: StagedRows | None = None  # started by read(step - 1)
        self.stats: dict[str, int] = dict(
            lookups=0,
            hits=0,
            demand_ids=0,
            prefetch_ids=0,
            prefetch_used=0,
            evictions=0,
            invalidations=0,
            local_updates=0,
            staged_updates=0,
            admitted=0,
            bypassed_reads=0,
            dependency_waits=0,
            skipped_dependency_waits=0,
        )
        self.commit_wait_s = 0.0
        self.shutdown_s = 0.0
        self.timer = PhaseTimer()  # where the stage's own time goes (cache_t_* metrics)
        # The training loop's timer: a read is its "pull" phase.
        self.phases = phases

    # -- read path ---------------------------------------------------------------------
    def read(self, step: int, keys: np.ndarray) -> torch.Tensor:
        """Rows of ``keys`` (sorted unique int64), float32 on the CPU, equal to the PS rows
        after every commit before ``step``: :meth:`begin`, the dependency wait, the demand
        pull, :meth:`complete` (a stage of several tables runs them itself, with one pull
        for all its tables)."""
        with self.phases("pull") if self.phases is not None else contextlib.nullcontext():
            pending = self.begin(step, keys)
            self.wait_dependency(pending)
            rows = None
            if len(pending.demand_pos):
                with self.timer("demand_pull"):
                    rows = self.client.pull(pending.demand)
            return self.complete(pending, rows)

    def begin(self, step: int, keys: np.ndarray, plan: StepPlan | None = None) -> PendingRead:
        """The cache's part of a read before the PS: plan (``plan``: one made for every table
        of the step at once; None: this reader's planner), hits, staged rows; what is left
        to pull from the PS is the result's :attr:`PendingRead.demand`."""
        with self.timer("submit_wait"):  # the previous step's submit and coherence
            self.committer.drain()
        with self.timer("plan"):
            if plan is None:
                plan = self.planner.plan(step, keys)
            elif plan.step != step or not np.array_equal(plan.keys, keys):
                raise RuntimeError(
                    f"step {step}: the plan given is step {plan.step}'s or of other keys"
                )
        self._plan = plan
        n = len(keys)
        # The query also refreshes the eviction scores of the hits, bypass or not: a row whose
        # score went stale (a past next use) would otherwise never be evicted again.
        with self.timer("query"):
            hit_pos, hit_slot = self.meta.query(keys, plan.scores)
            miss = np.ones(n, dtype=bool)
            miss[hit_pos] = False
            miss_pos = np.flatnonzero(miss)
        self.stats["lookups"] += n
        self.stats["hits"] += len(hit_pos)
        admit = self.bypass.use_cache()  # low hit rate: no admission (copies, evictions)
        if admit:
            self.bypass.record(len(hit_pos), n)
        else:
            self.stats["bypassed_reads"] += 1
        out = np.empty((n, self.dim), dtype=np.float32)
        with self.timer("fill"):
            if len(hit_pos):
                self.storage.gather_into(hit_slot, out, hit_pos)
            staged = self._take_staged(step)
            if staged is not None:
                out[staged.pos] = staged.rows
                miss[staged.pos] = False  # what remains in `miss` is read on demand
        demand_pos = np.flatnonzero(miss)
        dependency = -1
        if len(demand_pos):  # the last step that changed a demand row (its commit is needed)
            demand = keys[demand_pos]
            prev = plan.prev[demand_pos] if plan.prev is not None else None
            if prev is None:
                prev = self.meta.previous_update(demand)
            dependency = int(prev.max())
        return PendingRead(step, plan, keys, out, miss_pos, demand_pos, admit, dependency)

    def wait_dependency(self, pending: PendingRead) -> None:
        """Block until the commit the demand rows depend on is applied (if they need one)."""
        step = pending.step
        if len(pending.demand_pos) and pending.dependency > self.committer.committed:
            t0 = time.perf_counter()
            self.committer.wait_readable(pending.dependency + 1)
            waited = time.perf_counter() - t0
            self.commit_wait_s += waited
            self.timer.add("dependency_wait", waited)
            self.stats["dependency_waits"] += 1
        elif step > 0 and self.committer.committed < step - 1:
            self.stats["skipped_dependency_waits"] += 1

    def complete(self, pending: PendingRead, demand_rows: np.ndarray | None) -> torch.Tensor:
        """The read's end: the demand rows (pulled after :meth:`wait_dependency`) in place,
        misses admitted, the next step's misses staged; the rows of ``pending.keys``."""
        plan, keys, out, step = pending.plan, pending.keys, pending.out, pending.step
        if len(pending.demand_pos):
            assert demand_rows is not None, "the demand rows were not pulled"
            out[pending.demand_pos] = demand_rows
            self.stats["demand_ids"] += len(pending.demand_pos)
        if plan.prev is None:  # online: the metadata remembers which step changed which row
            self.meta.record_updates(plan.union, step)
            # ...and forgets it once that step is applied: such a row needs no wait.
            self.meta.prune_updates(self.committer.committed)
        miss_pos = pending.miss_pos
        if not pending.admit:
            miss_pos = miss_pos[:0]
        elif self.aggregation == "ps" and plan.scores is not None and len(miss_pos):
            # Prescan admission follows the plan: a row another worker also touches in this
            # step is invalidated right after it (coherence.py), so admitting it would only
            # evict a row that stays valid.  (Online mode keeps plain LRU admission.)
            miss_pos = miss_pos[~plan.shared[miss_pos]]
        with self.timer("fill"):
            self._admit(keys, miss_pos, out, plan.scores)
        with self.timer("prefetch_issue"):
            self._stage(step + 1)
        return torch.from_numpy(out)

    def _take_staged(self, step: int) -> StagedRows | None:
        pending, self._staged = self._staged, None
        if pending is None:
            return None
        if pending.step != step or pending.rows is None:  # not for this step: drop it
            pending.future.result()
            return None
        self.stats["prefetch_used"] += len(pending.pos)
        return pending

    def _admit(
        self, keys: np.ndarray, miss_pos: np.ndarray, out: np.ndarray, scores: np.ndarray | None
    ) -> None:
        if not len(miss_pos):
            return
        slots, src, evicted = admit_misses(
            self.meta,
            keys[miss_pos],
            None if scores is None else scores[miss_pos],
            self.storage.capacity_rows,
        )
        self.storage.scatter_from(slots, out, miss_pos[src])
        self.stats["admitted"] += len(slots)
        self.stats["evictions"] += len(evicted)

    def _stage(self, nxt_step: int) -> None:
        """Start pulling the rows ``nxt_step`` will miss, in the background while this step's
        forward/backward run: after commit ``nxt_step - 2`` is applied (the background thread
        waits for it) and before this worker submits ``nxt_step - 1``, every row holds its
        value after commit ``nxt_step - 2``; ``submit`` then brings the staged copies forward
        by one step.  Rows whose update in step ``nxt_step - 1`` this worker will not know
        (``ps`` aggregation, touched by another worker) are left to the demand path."""
        nxt = self.planner.upcoming(nxt_step) if self._pool is not None else None
        if nxt is None or not len(nxt.keys) or self._pool is None:
            return
        stage = self.meta.lookup(nxt.keys) < 0
        if self.aggregation == "ps":
            cur = self._plan  # step nxt_step - 1
            assert cur is not None and nxt.prev is not None
            changed = np.flatnonzero(nxt.prev == cur.step)
            if len(changed):  # known only where this worker alone touched the row
                at, known = find_sorted(cur.keys, nxt.keys[changed])
                known[known] = ~cur.shared[at[known]]
                stage[changed[~known]] = False
        pos = np.flatnonzero(stage)
        if not len(pos):
            return
        keys = nxt.keys[pos]
        self.stats["prefetch_ids"] += len(pos)
        future = self._pool.submit(
            pull_when_applied, self.client, self.committer, keys, nxt_step - 2
        )
        self._staged = StagedRows(nxt_step, pos, keys, future)

    # -- submit and coherence ----------------------------------------------------------
    def submit(self, step: int, keys: np.ndarray, grads: np.ndarray) -> None:
        """Hand step ``step``'s gradients to the commit protocol, then make resident and staged
        rows equal the PS rows after commit ``step``."""
        union, cohere = self.prepare_submit(step, keys, grads)
        # In background mode the exchange, the hand-off and cohere() overlap the dense phase;
        # the next read() drains them first.
        self.committer.submit(step, keys, grads, union=union, then=cohere)

    def prepare_submit(
        self, step: int, keys: np.ndarray, grads: np.ndarray
    ) -> tuple[np.ndarray, Callable[[Outgoing], None]]:
        """What the commit of ``step``'s gradients needs from this cache: the step's key union
        (known from the plan: no id exchange) and the coherence callback to run once the
        gradients are handed over (``then`` of the committer's submit)."""
        plan = self._plan
        if plan is None or plan.step != step:
            raise RuntimeError(f"submit({step}) without read({step})")
        staged = self._staged
        if staged is not None:  # the staged pull must read the PS before this step's commit
            with self.timer("prefetch_wait"):
                staged.rows = staged.future.result()
        if self.aggregation == "ps" and not np.array_equal(keys, plan.keys):
            raise RuntimeError(f"step {step}: gradients cover other keys than the rows read")

        def cohere(out: Outgoing) -> None:
            with self.timer("coherence"):
                self._coherence(out, plan, keys, grads, staged)

        return plan.union, cohere

    def _coherence(self, out: Outgoing, plan, keys, grads, staged: StagedRows | None) -> None:
        lr = self.schedule.rate(self.lr, plan.step)
        if self.aggregation == "collective":
            union, summed = out.written, out.summed
            assert union is not None and summed is not None
            self.stats["local_updates"] += coherence.after_collective_commit(
                self.meta, self.storage, union, summed, lr, self.world
            )
            if staged is not None and staged.rows is not None:
                self.stats["staged_updates"] += coherence.update_staged(
                    staged.keys, staged.rows, union, summed, lr, self.world
                )
        else:
            updated, dropped = coherence.after_ps_commit(
                self.meta, self.storage, plan, grads, lr, self.world
            )
            self.stats["local_updates"] += updated
            self.stats["invalidations"] += dropped
            if staged is not None and staged.rows is not None:
                mine = ~plan.shared
                self.stats["staged_updates"] += coherence.update_staged(
                    staged.keys, staged.rows, keys[mine], grads[mine], lr, self.world
                )

    # -- the rest of the step pipeline -------------------------------------------------
    def prefetch(self, step: int, unique: np.ndarray) -> None:
        """Nothing to do: prescan plans stage the next step's misses themselves."""

    def wait_readable(self, step: int) -> None:
        self.committer.wait_readable(step)

    def finish(self, last_step: int) -> None:
        self.committer.finish(last_step)
        self.close()

    # -- end ---------------------------------------------------------------------------
    def close(self) -> None:
        """Drain the prefetch worker and drop the plans (the prescan shut-down cost)."""
        t0 = time.perf_counter()
        if self._staged is not None:
            self._staged.future.result()
            self._staged = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if os.environ.get("GPU_CACHE_VERIFY") == "1":
            self.verify()
        self.planner.close()
        self.shutdown_s = time.perf_counter() - t0

    def verify(self) -> None:
        """Every resident row equals its PS row (call once all commits are applied)."""
        keys, slots = self.meta.resident()
        if len(keys):
            np.testing.assert_allclose(
                self.storage.gather(slots).cpu().numpy(),
                self.client.pull(keys),
                rtol=1e-6,
                atol=1e-7,
                err_msg="cached rows differ from the PS",
            )

    def metrics(self) -> dict[str, float]:
        s: dict[str, float] = dict(self.stats)
        s["hit_rate"] = s["hits"] / max(s["lookups"], 1)
        s["resident_bytes"] = self.storage.resident_bytes
        s["cache_commit_wait_s"] = self.commit_wait_s
        s["id_exchange_s"] = getattr(self.planner, "exchange_s", 0.0)  # online only
        s.update({f"t_{k}": v for k, v in self.timer.totals().items()})
        if isinstance(self.planner, PrescanPlanner):
            s["prescan_startup_s"] = self.planner.startup_s
            s["prescan_shutdown_s"] = self.shutdown_s
        return {
            f"cache_{k}" if not k.startswith(("cache_", "prescan_")) else k: v for k, v in s.items()
        }
