"""Keeping cached rows equal to the PS rows they mirror after each step's commit.

The PS applies ``w -= lr * (sum_r g_r) / W`` once per row.  A worker can reproduce that
exactly only where it knows the whole sum:

ps aggregation          rows only this worker touched: the sum is its own gradient, so the
                        cached copy gets ``w -= lr * g / W``; rows another worker touched are
                        invalidated and read from the PS (after the commit) on their next use.
collective aggregation  every worker holds the all-reduced sum of every row of the step, so
                        every resident row of the step is updated locally.

Rows the step did not touch keep their value, and eviction simply drops a row: a later miss
reads the PS after the commit of that row's previous update step (see controller.py).  Rows
staged for the next step (pulled before this step's commit) follow the same rule as resident
rows: ``update_staged`` applies the update the worker knows.
"""

from __future__ import annotations

import numpy as np
import torch

from cpu_dist.common.sorted_keys import find_sorted
from gpu_cache.cache_sgd import best_effort_sgd
from gpu_cache.plans import StepPlan
from gpu_cache.storage import RowStorage, sgd_step


def after_ps_commit(
    meta, storage: RowStorage, plan: StepPlan, grads: np.ndarray, lr: float, world: int
) -> tuple[int, int]:
    """``(rows updated locally, rows invalidated)`` for ps aggregation; ``grads`` are this
    worker's gradients of ``plan.keys``."""
    mine = np.flatnonzero(~plan.shared)
    updated = best_effort_sgd(meta, storage, plan.keys[mine], grads[mine], lr, world)
    if len(mine):  # the union minus the rows only this worker touched (both sorted)
        others = np.ones(len(plan.union), dtype=bool)
        others[np.searchsorted(plan.union, plan.keys[mine])] = False
        return updated, int(meta.invalidate(plan.union[others]))
    return updated, int(meta.invalidate(plan.union))


def after_collective_commit(
    meta, storage: RowStorage, union: np.ndarray, summed: np.ndarray, lr: float, world: int
) -> int:
    """Rows updated locally for collective aggregation (``summed``: all-reduced gradients)."""
    return best_effort_sgd(meta, storage, union, summed, lr, world)


def update_staged(
    staged_keys: np.ndarray,
    staged_rows: np.ndarray,
    keys: np.ndarray,
    grads: np.ndarray,
    lr: float,
    world: int,
) -> int:
    """Apply the step's known update (``keys`` sorted unique, their summed gradients) to the
    staged rows it covers, in place, exactly as the PS applies it; returns how many."""
    if not len(keys) or not len(staged_keys):
        return 0
    at, inside = find_sorted(keys, staged_keys)
    which = np.flatnonzero(inside)
    if len(which):
        rows = torch.from_numpy(staged_rows)
        rows[which] = sgd_step(rows[which], grads[at[which]], lr, world, owned=True)
    return len(which)
