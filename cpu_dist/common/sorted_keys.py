"""Sorted unique int64 key sets: how a step's keys are held everywhere (the batch's unique
keys, the rows a step wrote, a cache plan's union), and the one membership test between two
of them.  The early read's per-step test (``cpu_dist.sparse.reads.written_by``) is its native
twin, one merge pass (``_ps_client.mark_written``), held equal to it by its tests."""

from __future__ import annotations

import numpy as np


def find_sorted(sorted_keys: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(at, found)``: where each query would sit in ``sorted_keys`` (sorted, unique) and
    whether it is there, so ``sorted_keys[at[found]] == queries[found]``."""
    at = np.searchsorted(sorted_keys, queries)
    found = at < len(sorted_keys)
    found[found] = sorted_keys[at[found]] == queries[found]
    return at, found
