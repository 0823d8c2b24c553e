"""Reads of a job's only worker: it wrote every commit, so it brings its own rows forward.

With one worker (``--worker-num 1``), ps aggregation and SGD tables, every commit is this
worker's own gradient: the rows a step writes are its unique keys, and what commit t makes of
them is SGD's arithmetic on the rows step t read, ``_ps.apply_rows``, the shard's own
(``csrc/row_update.h``), so the worker holds them bit for bit as the shards will.  So no read
waits for a commit: step t+1's rows that steps t and t-1 wrote are the worker's, and the others
(which neither wrote) are pulled during step t, once commit t-2 is applied (the hand-off
waited for it already, a step ago).  The hand-off runs on its own thread, beside the dense
step.  The early pull's wait, rule 2 of ``cpu_dist.sparse.reads``, thus moves two steps back,
and the late read and the commit wait leave the critical path.

The shard still applies every commit in order (the hand-off of step t waits for commit t-1),
so evaluation, checkpoints, dumps and a resumed job see exactly the rows of the direct mode.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from cpu_dist.common.timing import PhaseTimer
from cpu_dist.sparse import _ps, _ps_client
from cpu_dist.sparse.commits import SparseCommitter
from cpu_dist.sparse.reads import EarlyPull, TableReads
from cpu_dist.train.pipelines.base import TableKeys, TableRows
from cpu_dist.train.pipelines.early import HintPipeline


@dataclass(frozen=True)
class _Held:
    """Rows as after commit ``step``: per table its written keys and their rows."""

    step: int
    keys: dict[str, np.ndarray]
    rows: dict[str, np.ndarray]


class SoleWriterPipeline(HintPipeline):
    """``--worker-num 1``, ``--sparse-sync pipelined``, ps aggregation, every table SGD, no
    table rules, no compression (see the module docstring).  Each table's rate is the one its
    commits carry (the session's: ``table_lrs``, or the one-table form's ``lr``)."""

    prefetch_early = True

    def __init__(
        self,
        reads: TableReads,
        committer: SparseCommitter,
        timer: PhaseTimer,
        dims: Mapping[str, int],
        timeout_s: float,
    ) -> None:
        super().__init__(reads, committer, timer, dims, timeout_s)
        session = committer.session
        self.lrs = dict(session.table_lrs) or dict.fromkeys(dims, session.lr)
        self._held: deque[_Held] = deque(maxlen=2)  # the last two commits' rows, newest last
        # The last read: (step, unique keys, rows), until its submit makes them held rows.
        self._read: tuple[int, dict[str, np.ndarray], dict[str, np.ndarray]] | None = None
        self.rows_held = self.rows_pulled = 0

    def _needed(self, step: int) -> list[int]:
        """The steps whose rows a read of ``step`` holds rather than pulls (this session's
        step-1 and step-2), newest first."""
        base = self.committer.session.base
        return [s for s in (step - 1, step - 2) if s >= base]

    def prefetch(self, step: int, unique: TableKeys) -> None:
        """Pull the rows of ``step`` that ``step - 1`` and ``step - 2`` do not write (called
        after the read of ``step - 1``, before or after its submit)."""
        written = {h.step: h.keys for h in self._held}
        if self._read is not None:
            written[self._read[0]] = self._read[1]
        need = self._needed(step)
        if step - 1 not in written or any(s not in written for s in need):
            return  # the read of step pulls everything
        self.committer.wait_applied(step - 3)  # the rows neither step writes hold it then
        self._early = EarlyPull(
            self.reads,
            step,
            unique,
            written[step - 1],
            self.dims,
            earlier=[written[s] for s in need[1:]],
        )

    def read(self, step: int, unique: TableKeys) -> TableRows:
        early = self._take(step, unique)
        levels = [h for s in self._needed(step) for h in self._held if h.step == s]
        if early is not None and len(levels) == len(self._needed(step)):
            with self.timer("pull"):
                rest = early.early.wait(self.timeout_s)
                rows = {
                    name: _ps_client.fill_rows(
                        keys, rest[name], [(h.keys[name], h.rows[name]) for h in levels]
                    )
                    for name, keys in unique.items()
                }
            pulled = sum(len(r) for r in rest.values())
            self.rows_held += sum(len(k) for k in unique.values()) - pulled
            self.committer.caught_up_read()
        else:  # no pull ahead, or not the held rows it was for
            if early is not None:
                early.discard(self.timeout_s)
            rows = self.pull_after_commit(step, unique)
            pulled = sum(len(k) for k in unique.values())
        self.rows_pulled += pulled
        self._read = (step, dict(unique), rows)
        return {name: torch.from_numpy(rows[name]) for name in unique}

    def submit(self, step: int, keys: TableKeys, grads: TableKeys) -> None:
        super().submit(step, keys, grads)
        read, self._read = self._read, None
        if (
            read is None
            or read[0] != step
            or any(not np.array_equal(k, read[1][name]) for name, k in keys.items())
        ):
            self._held.clear()  # rows this worker does not hold: the next read pulls them all
            return
        rows = read[2]  # the model is done with them: they become commit step's rows
        rate = self.committer.session.schedule.rate
        for name in keys:
            _ps.apply_rows(rows[name], grads[name], rate(self.lrs[name], step), "sgd", 1.0)
        self._held.append(_Held(step, dict(keys), {name: rows[name] for name in keys}))

    def finish(self, last_step: int) -> None:
        self._held.clear()
        super().finish(last_step)

    def metrics(self) -> dict[str, float]:
        return {"rows_held": self.rows_held, "rows_pulled": self.rows_pulled}
