"""CachedRowReader: the cache stage between the worker loop and the PS.

Per step ``read(step, keys)``: plan (online id exchange or prescan lookup) -> metadata query
-> wait only for the commit the misses depend on -> read misses from the PS (prefetched ones
first) -> gather hits, admit a bounded set of misses into the cache.  ``on_submit`` keeps the
cache coherent once the step's gradients are handed to the commit protocol (coherence.py) and,
in prescan mode, starts prefetching the next step's rows whose previous updates are committed.
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
        miss_keys = keys[miss_pos]
        self.stats["lookups"] += n
        self.stats["hits"] += len(hit_pos)
        pulled = self._read_misses(step, miss_keys)
        self.meta.record_updates(plan.union, step)  # step's commit will change these rows
        with self.timer("fill"):
            return self._assemble(n, hit_pos, hit_slot, miss_pos, miss_keys, pulled, plan)

    def _assemble(self, n, hit_pos, hit_slot, miss_pos, miss_keys, pulled, plan) -> torch.Tensor:
        if len(hit_pos) == 0:  # low-hit bypass: nothing to gather, the PS rows are the output
            self.stats["bypassed_reads"] += 1
            out = torch.from_numpy(pulled)
        else:
            out = torch.empty((n, self.dim), dtype=torch.float32)
            out[torch.from_numpy(hit_pos)] = self.storage.gather(hit_slot).cpu()
            out[torch.from_numpy(miss_pos)] = torch.from_numpy(pulled)
        self._admit(miss_keys, pulled, None if plan.scores is None else plan.scores[miss_pos])
        return out

    def _read_misses(self, step: int, miss_keys: np.ndarray) -> np.ndarray:
        rows = np.empty((len(miss_keys), self.dim), dtype=np.float32)
        need = np.ones(len(miss_keys), dtype=bool)
        if self._prefetch is not None:
            pstep, pkeys, fut = self._prefetch
            self._prefetch = None
            if pstep == step and len(pkeys):
                with self.timer("prefetch_wait"):
                    prow = fut.result()
                idx = np.searchsorted(pkeys, miss_keys).clip(max=len(pkeys) - 1)
                found = pkeys[idx] == miss_keys
                rows[found] = prow[idx[found]]
                need &= ~found
                self.stats["prefetch_used"] += int(found.sum())
        demand = miss_keys[need]
        # Wait only for the commit these rows depend on (their previous global update).
        dep = int(self.meta.previous_update(demand).max()) if len(demand) else -1
        if dep > self.updater.committed:
            t0 = time.perf_counter()
            self.updater.wait_readable(dep + 1)
            self.commit_wait_s += time.perf_counter() - t0
            self.timer.add("dependency_wait", time.perf_counter() - t0)
            self.stats["dependency_waits"] += 1
        elif step > 0 and self.updater.committed < step - 1:
            self.stats["skipped_dependency_waits"] += 1
        if len(demand):
            with self.timer("demand_pull"):
                rows[need] = self.client.pull(demand)
            self.stats["demand_ids"] += len(demand)
            self.bytes_pulled += demand.nbytes + len(demand) * self.dim * 4
        return rows

    def _admit(self, keys: np.ndarray, rows: np.ndarray, scores: np.ndarray | None) -> None:
        slots, src, evicted = admit_misses(self.meta, keys, scores, self.storage.capacity_rows)
        if len(slots):
            self.storage.scatter(slots, self.storage.to_device(rows[src]))
        self.stats["admitted"] += len(slots)
        self.stats["evictions"] += len(evicted)

    # -- coherence ---------------------------------------------------------------------
    def on_submit(self, step: int, keys: np.ndarray, grads: np.ndarray) -> None:
        """After ``updater.submit(step, ...)``: make resident rows equal the PS rows after
        commit ``step``, then prefetch what the next step can read already."""
        plan = self._plan
        if plan is None or plan.step != step:
            raise RuntimeError(f"on_submit({step}) without read({step})")
        with self.timer("coherence"):
            self._coherence(step, plan, keys, grads)
        with self.timer("prefetch_issue"):
            self._start_prefetch(step + 1)

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

    def _start_prefetch(self, step: int) -> None:
        nxt = self.planner.peek(step) if self._pool is not None else None
        if nxt is None or not len(nxt):
            return
        cand = nxt[self.meta.lookup(nxt) < 0]
        ready = cand[self.meta.previous_update(cand) <= self.updater.committed]
        if len(ready):
            self.stats["prefetch_ids"] += len(ready)
            self.bytes_pulled += ready.nbytes + len(ready) * self.dim * 4
            self._prefetch = (step, ready, self._pool.submit(self.client.pull, ready))

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
