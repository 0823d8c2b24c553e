"""Who touches which rows at each step: the per-step plans of the cache controller.

A :class:`StepPlan` tells one worker, for one step, the union of all workers' unique keys
(every row the step's commit will change), which of its own keys another worker touches too
(those cannot be updated locally in ``ps`` aggregation) and, in prescan mode, the eviction
score of each of its keys (minus the step of its next use, so "smallest score first" evicts
the row needed farthest in the future).

OnlinePlanner exchanges the unique keys of all workers at every step (one Allgatherv);
OnlineTablesPlanner does the same for every table of a step in one exchange.
PrescanPlanner reads the whole id trace before training, exchanges it once and keeps the
plans in CPU memory; during training it checks that the ids are the ones it scanned.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from cpu_dist.common.mpi_context import allgather_keys, allgather_tables

# Score of a row with no use inside the plan window: below every real "minus next use".
FAR = np.iinfo(np.int64).min // 4


@dataclass
class StepPlan:
    step: int
    keys: np.ndarray  # this worker's sorted unique keys
    union: np.ndarray  # sorted union over all workers
    shared: np.ndarray  # bool per own key: another worker touches it too
    scores: np.ndarray | None  # eviction scores of own keys (prescan), None: LRU
    # Per own key: the last earlier step whose commit changed it (-1: none), known from the
    # prescan; None online (the controller then records updates in the metadata).
    prev: np.ndarray | None = None


def _union_and_shared(all_keys: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    union, shared, _ = _union_shared_pos(all_keys, own)
    return union, shared


def _union_shared_pos(all_keys: np.ndarray, own: np.ndarray):
    """Sorted union, the shared flag of each own key, and each own key's position in the union."""
    union, counts = np.unique(all_keys, return_counts=True)
    pos = np.searchsorted(union, own)
    shared = counts[pos] > 1 if len(own) else np.zeros(0, dtype=bool)
    return union, shared, pos


def _previous_steps(unions: list[np.ndarray]) -> list[np.ndarray]:
    """Per step, per union key: the last earlier step whose union holds it (-1: none)."""
    if not unions:
        return []
    lengths = np.array([len(u) for u in unions], dtype=np.int64)
    flat = np.concatenate(unions)
    steps = np.repeat(np.arange(len(unions), dtype=np.int64), lengths)
    order = np.lexsort((steps, flat))  # by key, then step
    k_sorted, s_sorted = flat[order], steps[order]
    prev_sorted = np.full(len(flat), -1, dtype=np.int64)
    same = k_sorted[1:] == k_sorted[:-1]
    prev_sorted[1:][same] = s_sorted[:-1][same]
    prev = np.empty_like(prev_sorted)
    prev[order] = prev_sorted
    return np.split(prev, np.cumsum(lengths)[:-1])


class OnlinePlanner:
    """Exchanges this step's unique keys with every worker (no knowledge of the future)."""

    prescan = False

    def __init__(self, comm) -> None:
        self.comm = comm
        self.exchange_s = 0.0
        self.ids_exchanged = 0

    def plan(self, step: int, keys: np.ndarray) -> StepPlan:
        t0 = time.perf_counter()
        if self.comm.Get_size() == 1:
            union, shared = keys, np.zeros(len(keys), dtype=bool)
        else:
            all_keys = allgather_keys(self.comm, keys)
            self.ids_exchanged += len(all_keys)
            union, shared = _union_and_shared(all_keys, keys)
        self.exchange_s += time.perf_counter() - t0
        return StepPlan(step, keys, union, shared, None)

    def upcoming(self, step: int) -> StepPlan | None:
        return None  # the future is unknown online

    def close(self) -> None:
        pass


class OnlineTablesPlanner:
    """:class:`OnlinePlanner` for every table of a step at once: one exchange of all tables'
    keys, not one per table."""

    def __init__(self, comm) -> None:
        self.comm = comm
        self.exchange_s = 0.0
        self.ids_exchanged = 0

    def plan(self, step: int, parts: Mapping[str, np.ndarray]) -> dict[str, StepPlan]:
        t0 = time.perf_counter()
        if self.comm.Get_size() == 1:
            out = {
                n: StepPlan(step, k, k, np.zeros(len(k), dtype=bool), None)
                for n, k in parts.items()
            }
        else:
            every = allgather_tables(self.comm, parts)
            self.ids_exchanged += sum(len(v) for v in every.values())
            out = {}
            for name, keys in parts.items():
                union, shared = _union_and_shared(every[name], keys)
                out[name] = StepPlan(step, keys, union, shared, None)
        self.exchange_s += time.perf_counter() - t0
        return out


class PrescanMismatch(RuntimeError):
    """Training asked for ids that differ from the prescanned trace."""


class PrescanPlanner:
    """Plans for every step, built before training from this worker's whole id trace.

    ``trace`` yields this worker's sorted unique keys of steps 0, 1, ...; ``window`` bounds
    how far ahead next uses are looked up (0: the whole trace).
    """

    prescan = True

    def __init__(self, comm, trace: Iterable[np.ndarray], window: int = 0) -> None:
        t0 = time.perf_counter()
        own = [np.ascontiguousarray(k, dtype=np.int64) for k in trace]
        self.steps = len(own)
        self.window = int(window)
        lengths = np.array([len(k) for k in own], dtype=np.int64)
        flat = np.concatenate(own) if own else np.zeros(0, dtype=np.int64)
        world = comm.Get_size()
        if world > 1:  # one exchange for the whole run: every worker's trace, then its lengths
            all_flat = allgather_keys(comm, flat)
            all_lengths = np.asarray(comm.allgather(lengths))
            self.ids_exchanged = len(all_flat)
        else:
            all_flat, all_lengths, self.ids_exchanged = flat, lengths[None, :], 0
        starts = np.concatenate([[0], np.cumsum(all_lengths.sum(axis=1))[:-1]])
        self.plans: list[StepPlan] = []
        worker_offsets = np.zeros(world, dtype=np.int64)
        scores = self._scores(own, flat, lengths)
        unions, shareds, positions = [], [], []
        for t in range(self.steps):
            parts = []
            for w in range(world):
                begin = int(starts[w] + worker_offsets[w])
                parts.append(all_flat[begin : begin + int(all_lengths[w, t])])
                worker_offsets[w] += all_lengths[w, t]
            union, shared, pos = (
                _union_shared_pos(np.concatenate(parts), own[t])
                if world > 1
                else (own[t], np.zeros(len(own[t]), dtype=bool), np.arange(len(own[t])))
            )
            unions.append(union)
            shareds.append(shared)
            positions.append(pos)
        prev = _previous_steps(unions)
        for t in range(self.steps):
            self.plans.append(
                StepPlan(t, own[t], unions[t], shareds[t], scores[t], prev[t][positions[t]])
            )
        self.startup_s = time.perf_counter() - t0

    def _scores(
        self, own: list[np.ndarray], flat: np.ndarray, lengths: np.ndarray
    ) -> list[np.ndarray]:
        """Per step, per own key: minus the step of its next use by this worker (FAR if none
        within the window)."""
        steps = np.repeat(np.arange(len(own), dtype=np.int64), lengths)
        order = np.lexsort((steps, flat))  # by key, then step
        k_sorted, s_sorted = flat[order], steps[order]
        nxt = np.full(len(flat), -1, dtype=np.int64)
        same = k_sorted[1:] == k_sorted[:-1]
        nxt_sorted = np.where(np.append(same, False), np.append(s_sorted[1:], -1), -1)
        nxt[order] = nxt_sorted
        score = np.where(nxt < 0, FAR, -nxt)
        if self.window > 0:
            score = np.where((nxt >= 0) & (nxt - steps > self.window), FAR, score)
        return np.split(score, np.cumsum(lengths)[:-1]) if len(own) else []

    def plan(self, step: int, keys: np.ndarray) -> StepPlan:
        if step >= self.steps:
            raise PrescanMismatch(f"prescan: step {step} is past the {self.steps} scanned steps")
        p = self.plans[step]
        if not np.array_equal(p.keys, keys):
            raise PrescanMismatch(
                f"prescan: the ids of step {step} differ from the scanned trace "
                f"({len(keys)} unique keys now, {len(p.keys)} scanned); prescan needs the same "
                f"id sequence during training (same data, seed, batch size and workers)"
            )
        return p

    def upcoming(self, step: int) -> StepPlan | None:
        """The plan of a later step (prefetch), without the id check of :meth:`plan`."""
        return self.plans[step] if 0 <= step < len(self.plans) else None

    def close(self) -> None:
        self.plans.clear()
