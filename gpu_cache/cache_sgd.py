"""Cache SGD on resident rows, the two contracts of the design:

strict       duplicates are summed first and every row is updated once; if any requested key
             is not resident, every requested key is invalidated and the call returns False
             (the caller then relies on the PS copy), so no half-updated set survives.
best_effort  resident keys are updated, missing keys are skipped; returns how many updated.
"""

from __future__ import annotations

import numpy as np

from gpu_cache.storage import RowStorage


def sum_duplicates(keys: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique keys and the per-key sum of their gradient rows (float32)."""
    keys = np.asarray(keys, dtype=np.int64)
    if len(keys) < 2 or bool((keys[1:] > keys[:-1]).all()):  # already sorted unique (common)
        return keys, np.ascontiguousarray(grads, dtype=np.float32)
    uniq, inverse = np.unique(keys, return_inverse=True)
    if len(uniq) == len(keys):
        order = np.argsort(keys, kind="stable")
        return keys[order], np.ascontiguousarray(grads[order], dtype=np.float32)
    summed = np.zeros((len(uniq), grads.shape[1]), dtype=np.float32)
    np.add.at(summed, inverse, grads)
    return uniq, summed


def strict_sgd(
    meta, storage: RowStorage, keys: np.ndarray, grads: np.ndarray, lr: float, divisor: int = 1
) -> bool:
    uniq, summed = sum_duplicates(keys, grads)
    slots = meta.lookup(uniq)
    if (slots < 0).any():
        meta.invalidate(uniq)
        return False
    storage.sgd(slots, summed, lr, divisor)
    return True


def best_effort_sgd(
    meta, storage: RowStorage, keys: np.ndarray, grads: np.ndarray, lr: float, divisor: int = 1
) -> int:
    uniq, summed = sum_duplicates(keys, grads)
    if storage.host_rows is not None:  # one native pass: lookup and update
        return int(meta.sgd_resident(uniq, summed, lr, float(divisor), storage.host_rows))
    slots = meta.lookup(uniq)
    hit = np.flatnonzero(slots >= 0)
    # summed[hit] is a fresh copy, so the storage may scale it in place
    storage.sgd(slots[hit], np.ascontiguousarray(summed[hit]), lr, divisor, owned=True)
    return len(hit)
