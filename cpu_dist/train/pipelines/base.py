"""What every step pipeline speaks, and the plainest one: wait for the commit, then pull."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np
import torch

from cpu_dist.common.timing import PhaseTimer
from cpu_dist.sparse.aggregation import TableOutgoing
from cpu_dist.sparse.commits import SparseCommitter
from cpu_dist.sparse.reads import TableReads

# Per table (the job's tables in their order; the default job's one is "embedding"): a
# step's sorted unique keys, or their rows.
TableKeys = Mapping[str, np.ndarray]
TableRows = dict[str, torch.Tensor]


class StepPipeline(Protocol):
    """The sparse half of a step, for every table of the job at once."""

    # True: ``prefetch(step + 1)`` as soon as ``read(step)`` returned (before forward);
    # False: after ``submit(step)`` (a pipeline that needs the rows step writes).
    prefetch_early: bool

    def read(self, step: int, unique: TableKeys) -> TableRows:
        """Rows of each table's ``unique`` keys as after every commit before ``step``."""
        ...

    def submit(self, step: int, keys: TableKeys, grads: TableKeys) -> None:
        """Hand ``step``'s gradients of these rows (per table) to the PS."""
        ...

    def prefetch(self, step: int, unique: TableKeys) -> None:
        """A hint: ``step``'s keys are known already."""
        ...

    def wait_readable(self, step: int) -> None:
        """Block until every step before ``step`` is applied (evaluation, checkpoints)."""
        ...

    def finish(self, last_step: int) -> None:
        """Wait for the last commit, close the session and stop background work."""
        ...

    def metrics(self) -> dict[str, float]: ...


def tensors(unique: TableKeys, rows: Mapping[str, np.ndarray]) -> TableRows:
    """The rows of every table of ``unique`` as tensors, in its order (no copy)."""
    return {name: torch.from_numpy(rows[name]) for name in unique}


class DirectPipeline:
    """Each read waits for the commit it depends on (t-1, or t-1-K with ``--sparse-sync
    async``), then pulls every table of the step in one request per shard per max-keys
    (:class:`TableReads`); each step's gradients go out as one commit of every table
    (``SparseCommitter.submit_tables``)."""

    prefetch_early = False

    def __init__(
        self,
        reads: TableReads,
        committer: SparseCommitter,
        timer: PhaseTimer,
        dims: Mapping[str, int],
    ) -> None:
        self.reads, self.committer, self.timer = reads, committer, timer
        self.dims = dict(dims)  # each table's width (the early pulls' assembly)
        # Per table, the rows the last submitted step writes (None: not known).
        self.written: dict[str, np.ndarray | None] = {}

    def read(self, step: int, unique: TableKeys) -> TableRows:
        return tensors(unique, self.pull_after_commit(step, unique))

    def pull_after_commit(self, step: int, unique: TableKeys) -> dict[str, np.ndarray]:
        """Every row of ``unique`` (per table, numpy), pulled once the read of ``step`` may go
        ahead."""
        with self.timer("commit_wait"):
            self.committer.wait_for_read(step)
        with self.timer("pull"):
            return self.reads.pull(unique)

    def submit(self, step: int, keys: TableKeys, grads: TableKeys) -> None:
        self.handed_over(self.committer.submit_tables(step, {n: (keys[n], grads[n]) for n in keys}))

    def handed_over(self, out: TableOutgoing) -> None:
        """What the step just submitted writes, for the next step's early pull."""
        self.written = {n: o.written for n, o in out.items()}

    def prefetch(self, step: int, unique: TableKeys) -> None:
        pass

    def wait_readable(self, step: int) -> None:
        self.committer.wait_readable(step)

    def finish(self, last_step: int) -> None:
        self.committer.finish(last_step)

    def metrics(self) -> dict[str, float]:
        return {}
