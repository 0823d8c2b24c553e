"""Reading step t+1's rows while step t's commit is still being applied.

A row that no worker wrote in step t holds the same value before and after commit t, so it may
be pulled as soon as step t+1's keys are known (in the background, overlapping the dense
all-reduce and optimizer step); only the rows step t wrote wait for commit t.  This is the
"a pull waits only for the rows it reads" rule of the commit protocol, at row granularity.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from cpu_dist.data.keys import find_sorted
from cpu_dist.sparse import Client


class SplitPull:
    """Started with the next step's sorted unique keys and the sorted keys step t wrote."""

    def __init__(
        self,
        client: Client,
        pool: ThreadPoolExecutor,
        unique: np.ndarray,
        written: np.ndarray,
        timeout_s: float,
    ) -> None:
        self.client, self.unique, self.timeout_s = client, unique, timeout_s
        _, hit = find_sorted(written, unique)
        self.dependent = np.flatnonzero(hit)
        self.independent = np.flatnonzero(~hit)
        # The client releases the GIL for the whole pull, so this runs beside the main thread.
        self._early: Future = pool.submit(client.pull, unique[self.independent])

    def finish(self) -> np.ndarray:
        """All rows of ``unique``; call once commit t is applied."""
        rows = np.empty((len(self.unique), self.client.dim), dtype=np.float32)
        if len(self.dependent):
            rows[self.dependent] = self.client.pull(self.unique[self.dependent])
        rows[self.independent] = self._early.result(timeout=self.timeout_s)
        return rows
