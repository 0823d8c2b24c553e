"""Reading rows while commits are still being applied: the two rules, written once.

1. A row that step t did not write holds the same value before and after commit t, so it may
   be pulled as soon as step t+1's keys are known (:func:`written_by`, :class:`EarlyPull`).
2. A row whose last writer is step s may be read once commit s is applied
   (:func:`pull_when_applied`: the commit-dependency wait).

The uncached early pull and the cache stage's demand reads and staging all go through these.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from cpu_dist.common.sorted_keys import find_sorted
from cpu_dist.sparse import Client


class AppliedWaiter(Protocol):
    def wait_applied(self, step: int) -> None: ...


def written_by(keys: np.ndarray, written: np.ndarray | None) -> np.ndarray:
    """Bool per key: step t wrote it (``written``: the sorted rows step t writes; None: unknown,
    so every row counts as written)."""
    if written is None:
        return np.ones(len(keys), dtype=bool)
    return find_sorted(written, keys)[1]


def pull_when_applied(
    client: Client, commits: AppliedWaiter, keys: np.ndarray, step: int
) -> np.ndarray:
    """Rows of ``keys`` once commit ``step`` (their last writer, or later) is applied."""
    commits.wait_applied(step)
    return client.pull(keys)


class EarlyPull:
    """Step t+1's rows (``unique``, sorted): those step t did not write are pulled now, in
    the background (the client releases the GIL); the rest once commit t is applied."""

    def __init__(
        self,
        client: Client,
        commits: AppliedWaiter,
        step: int,
        unique: np.ndarray,
        written: np.ndarray | None,
    ) -> None:
        self.client, self.commits, self.step, self.unique = client, commits, step, unique
        dependent = written_by(unique, written)
        self.dependent = np.flatnonzero(dependent)
        self.independent = np.flatnonzero(~dependent)
        self._early = client.pull_async(unique[self.independent])

    def finish(self, timeout_s: float) -> np.ndarray:
        """Every row of ``unique``, as after commit ``step - 1``."""
        rows = np.empty((len(self.unique), self.client.dim), dtype=np.float32)
        if len(self.dependent):
            keys = self.unique[self.dependent]
            rows[self.dependent] = pull_when_applied(self.client, self.commits, keys, self.step - 1)
        rows[self.independent] = self._early.wait(timeout_s)
        return rows

    def discard(self, timeout_s: float) -> None:
        """Let the early pull end without using it (its step never ran)."""
        self._early.wait(timeout_s)
