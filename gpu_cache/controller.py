"""CachedRowReader: the cache stage between the worker loop and the PS.

Per step ``read(step, keys)``: plan (online id exchange or prescan lookup) -> metadata query
-> gather hits -> wait only for the commit the remaining misses depend on and pull them ->
take the prefetched rows -> admit a bounded set of misses into the cache -> in prescan mode,
start prefetching the next step's misses whose previous updates are committed, so that pull
overlaps forward/backward (the client releases the GIL).  ``on_submit`` keeps the cache
coherent once the step's gradients are handed to the commit protocol (coherence.py).
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import time

import numpy as np
import torch

from cpu_dist.train.metrics import PhaseTimer
from gpu_cache import coherence
from gpu_cache._metadata import BagPipeCacheMetadata
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


class CachedRowReader:
    def __init__(self, client, updater, planner, *, dim: int, capacity_units: int, lr: float,
                 aggregation: str, world: int, device=None, prefetch: bool = True) -> None:
        self.client, self.updater, self.planner = client, updater, planner
        self.storage = RowStorage(capacity_units, dim, device)
        self.meta = BagPipeCacheMetadata(self.storage.capacity_rows)
        self.lr, self.aggregation, self.world, self.dim = float(lr), aggregation, world, dim
        self._plan = None
        self._pool = cf.ThreadPoolExecutor(1) if planner.prescan and prefetch else None
        # (step, positions in that step's keys, future of their rows): started by read(step-1)
        self._prefetch: tuple[int, np.ndarray, cf.Future] | None = None
        self.stats = dict(lookups=0, hits=0, demand_ids=0, prefetch_ids=0, prefetch_used=0,
                          evictions=0, invalidations=0, local_updates=0, admitted=0,
                          bypassed_reads=0, dependency_waits=0, skipped_dependency_waits=0)
        self.bytes_pulled = 0
        self.commit_wait_s = 0.0
        self.shutdown_s = 0.0
        self.timer = PhaseTimer()  # where the stage's own time goes (cache_t_* metrics)

    # -- read path ---------------------------------------------------------------------
    def read(self, step: int, keys: np.ndarray) -> torch.Tensor:
        """Rows of ``keys`` (sorted unique int64), float32 on the CPU, equal to the PS rows
        after every commit before ``step``."""
        with self.timer("plan"):
            plan = self.planner.plan(step, keys)
        self._plan = plan
        n = len(keys)
        with self.timer("query"):
            hit_pos, hit_slot = self.meta.query(keys, plan.scores)
            miss = np.ones(n, dtype=bool)
            miss[hit_pos] = False
            miss_pos = np.flatnonzero(miss)
        self.stats["lookups"] += n
        self.stats["hits"] += len(hit_pos)
        out = np.empty((n, self.dim), dtype=np.float32)
        with self.timer("fill"):  # hits first: CPU work while a prefetch may still be pulling
            if len(hit_pos):
                out[hit_pos] = self.storage.gather(hit_slot).cpu().numpy()
            else:
                self.stats["bypassed_reads"] += 1
        prefetched = self._take_prefetch(step)
        if prefetched is not None:
            miss[prefetched[0]] = False  # what remains in `miss` is read on demand
        self._read_demand(step, plan, keys, np.flatnonzero(miss), out)
        if prefetched is not None:
            with self.timer("prefetch_wait"):
                out[prefetched[0]] = prefetched[1].result()
        if plan.prev is None:  # online: the metadata remembers which step changed which row
            self.meta.record_updates(plan.union, step)
        with self.timer("fill"):
            self._admit(keys, miss_pos, out, plan.scores)
        with self.timer("prefetch_issue"):
            self._start_prefetch(step + 1)
        return torch.from_numpy(out)

    def _take_prefetch(self, step: int) -> tuple[np.ndarray, cf.Future] | None:
        """(positions in this step's keys, future of their rows) of the prefetch for ``step``."""
        pending, self._prefetch = self._prefetch, None
        if pending is None:
            return None
        pstep, pos, fut = pending
        if pstep != step:  # never started for this step: drain it and read everything anew
            fut.result()
            return None
        self.stats["prefetch_used"] += len(pos)
        return pos, fut

    def _read_demand(self, step: int, plan, keys: np.ndarray, pos: np.ndarray,
                     out: np.ndarray) -> None:
        """Pull the rows at ``pos`` into ``out`` once the commit they depend on is applied."""
        if not len(pos):
            if step > 0 and self.updater.committed < step - 1:
                self.stats["skipped_dependency_waits"] += 1
            return
        demand = keys[pos]
        prev = plan.prev[pos] if plan.prev is not None else self.meta.previous_update(demand)
        dep = int(prev.max())
        if dep > self.updater.committed:
            t0 = time.perf_counter()
            self.updater.wait_readable(dep + 1)
            waited = time.perf_counter() - t0
            self.commit_wait_s += waited
            self.timer.add("dependency_wait", waited)
            self.stats["dependency_waits"] += 1
        elif step > 0 and self.updater.committed < step - 1:
            self.stats["skipped_dependency_waits"] += 1
        with self.timer("demand_pull"):
            out[pos] = self.client.pull(demand)
        self.stats["demand_ids"] += len(demand)
        self.bytes_pulled += demand.nbytes + len(demand) * self.dim * 4

    def _admit(self, keys: np.ndarray, miss_pos: np.ndarray, out: np.ndarray,
               scores: np.ndarray | None) -> None:
        if not len(miss_pos):
            return
        slots, src, evicted = admit_misses(self.meta, keys[miss_pos],
                                           None if scores is None else scores[miss_pos],
                                           self.storage.capacity_rows)
        if len(slots):
            self.storage.scatter(slots, self.storage.to_device(out[miss_pos[src]]))
        self.stats["admitted"] += len(slots)
        self.stats["evictions"] += len(evicted)

    def _start_prefetch(self, step: int) -> None:
        """Pull, in the background while forward/backward run, the rows ``step`` will miss
        whose previous update is already committed (so no later commit before ``step``
        changes them: the commit of the current step only touches rows with a newer step)."""
        nxt = self.planner.upcoming(step) if self._pool is not None else None
        if nxt is None or not len(nxt.keys):
            return
        ready = self.meta.lookup(nxt.keys) < 0
        ready &= nxt.prev <= self.updater.committed
        pos = np.flatnonzero(ready)
        if len(pos):
            keys = nxt.keys[pos]
            self.stats["prefetch_ids"] += len(pos)
            self.bytes_pulled += keys.nbytes + len(keys) * self.dim * 4
            self._prefetch = (step, pos, self._pool.submit(self.client.pull, keys))

    # -- coherence ---------------------------------------------------------------------
    def on_submit(self, step: int, keys: np.ndarray, grads: np.ndarray) -> None:
        """After ``updater.submit(step, ...)``: make resident rows equal the PS rows after
        commit ``step`` (the next step's prefetch was started by ``read``)."""
        plan = self._plan
        if plan is None or plan.step != step:
            raise RuntimeError(f"on_submit({step}) without read({step})")
        with self.timer("coherence"):
            self._coherence(step, plan, keys, grads)

    def _coherence(self, step, plan, keys, grads) -> None:
        if self.aggregation == "collective":
            union, summed = self.updater.last_reduced
            self.stats["local_updates"] += coherence.after_collective_commit(
                self.meta, self.storage, union, summed, self.lr, self.world)
        else:
            updated, dropped = coherence.after_ps_commit(
                self.meta, self.storage, plan, keys, grads, self.lr, self.world)
            self.stats["local_updates"] += updated
            self.stats["invalidations"] += dropped

    # -- end ---------------------------------------------------------------------------
    def close(self) -> None:
        """Drain the prefetch worker and drop the plans (the prescan shut-down cost)."""
        t0 = time.perf_counter()
        if self._prefetch is not None:
            self._prefetch[2].result()
            self._prefetch = None
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
            np.testing.assert_allclose(self.storage.gather(slots).cpu().numpy(),
                                       self.client.pull(keys), rtol=1e-6, atol=1e-7,
                                       err_msg="cached rows differ from the PS")

    def metrics(self) -> dict:
        s = dict(self.stats)
        s["hit_rate"] = s["hits"] / max(s["lookups"], 1)
        s["resident_bytes"] = self.storage.resident_bytes
        s["cache_commit_wait_s"] = self.commit_wait_s
        s["gradient_payload_bytes"] = self.updater.payload_bytes
        s["id_exchange_s"] = getattr(self.planner, "exchange_s", 0.0)
        s.update({f"t_{k}": v for k, v in self.timer.totals().items()})
        if self.planner.prescan:
            s["prescan_startup_s"] = self.planner.startup_s
            s["prescan_shutdown_s"] = self.shutdown_s
        return {f"cache_{k}" if not k.startswith(("cache_", "prescan_", "gradient_")) else k: v
                for k, v in s.items()}
