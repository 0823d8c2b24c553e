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
from cpu_dist.sparse.reads import TableReads, TablesPull
from cpu_dist.train.pipelines.base import DirectPipeline, TableKeys, TableRows


@dataclass(frozen=True)
class _Held:
    """Rows as after commit ``step``: per table its written keys and their rows."""

    step: int
    keys: dict[str, np.ndarray]
    rows: dict[str, np.ndarray]


@dataclass
class _Ahead:
    """Step ``step``'s pull of the rows that the two steps before it did not write."""

    step: int
    unique: dict[str, np.ndarray]
    pull: TablesPull


class SoleWriterPipeline(DirectPipeline):
    """``--worker-num 1``, ``--sparse-sync pipelined``, ps aggregation, every table SGD, no
    table rules, no compression (see the module docstring)."""

    prefetch_early = True

    def __init__(
        self,
        reads: TableReads,
        committer: SparseCommitter,
        timer: PhaseTimer,
        dims: Mapping[str, int],
        lrs: Mapping[str, float],
        timeout_s: float,
    ) -> None:
        """``lrs``: each table's base learning rate (its commits carry the schedule's rate of
        it, and so does the worker's own update)."""
        super().__init__(reads, committer, timer, dims)
        self.lrs, self.timeout_s = dict(lrs), timeout_s
        self.schedule = committer.session.schedule
        self._held: deque[_Held] = deque(maxlen=2)  # the last two commits' rows, newest last
        self._read: tuple[int, dict[str, np.ndarray], dict[str, np.ndarray]] | None = None
        self._ahead: _Ahead | None = None
        self.rows_held = self.rows_pulled = 0

    def _levels(self, step: int) -> list[_Held] | None:
        """The held commits a read of ``step`` takes rows from (step-1, then step-2), or None
        where they are not the ones it needs (a read that was not the previous step's)."""
        levels = list(reversed(self._held))
        need = [s for s in (step - 1, step - 2) if s >= self.committer.session.base]
        if [h.step for h in levels[: len(need)]] != need:
            return None
        return levels[: len(need)]

    def prefetch(self, step: int, unique: TableKeys) -> None:
        """Pull the rows of ``step`` that ``step - 1`` and ``step - 2`` do not write (called
        after the read of ``step - 1``, before or after its submit)."""
        self._discard()
        written = {h.step: h.keys for h in self._held}
        if self._read is not None:
            written[self._read[0]] = self._read[1]
        need = [s for s in (step - 1, step - 2) if s >= self.base]
        if step - 1 not in written or any(s not in written for s in need):
            return  # the read of step pulls everything
        self.committer.wait_applied(step - 3)  # the rows neither step writes hold it then
        rest = {}
        for name, keys in unique.items():
            mine = np.zeros(len(keys), dtype=bool)
            for s in need:
                mine |= _ps_client.mark_written(keys, written[s][name])
            rest[name] = keys[~mine]
        self._ahead = _Ahead(step, dict(unique), self.reads.pull_async(rest))

    @property
    def base(self) -> int:
        return self.committer.session.base

    def _discard(self) -> None:
        if self._ahead is not None:  # a pull for a step that never read it: let it end
            self._ahead.pull.wait(self.timeout_s)
            self._ahead = None

    def read(self, step: int, unique: TableKeys) -> TableRows:
        ahead, self._ahead = self._ahead, None
        levels = self._levels(step)
        usable = (
            ahead is not None
            and levels is not None
            and ahead.step == step
            and ahead.unique.keys() == unique.keys()
            and all(np.array_equal(ahead.unique[n], unique[n]) for n in unique)
        )
        if not usable:
            if ahead is not None:
                ahead.pull.wait(self.timeout_s)
            with self.timer("commit_wait"):
                self.committer.wait_for_read(step)
            with self.timer("pull"):
                rows = self.reads.pull(unique)
            self.rows_pulled += sum(len(k) for k in unique.values())
        else:
            assert ahead is not None and levels is not None
            with self.timer("pull"):
                rest = ahead.pull.wait(self.timeout_s)
                rows = {
                    name: _ps_client.fill_rows(
                        keys, rest[name], [(h.keys[name], h.rows[name]) for h in levels]
                    )
                    for name, keys in unique.items()
                }
            pulled = sum(len(r) for r in rest.values())
            self.rows_pulled += pulled
            self.rows_held += sum(len(k) for k in unique.values()) - pulled
            self.committer.caught_up_read()
        self._read = (step, dict(unique), rows)
        return {name: torch.from_numpy(rows[name]) for name in unique}

    def submit(self, step: int, keys: TableKeys, grads: TableKeys) -> None:
        super().submit(step, keys, grads)
        read = self._read
        if read is None or read[0] != step:
            self._held.clear()  # rows this worker does not hold: the next read pulls them all
            return
        _, unique, rows = read
        after: dict[str, np.ndarray] = {}
        for name, k in keys.items():
            if not np.array_equal(k, unique[name]):
                self._held.clear()
                return
            r = rows[name]  # the model is done with them: they become commit step's rows
            _ps.apply_rows(r, grads[name], self.schedule.rate(self.lrs[name], step), "sgd", 1.0)
            after[name] = r
        self._held.append(_Held(step, dict(keys), after))
        self._read = None

    def finish(self, last_step: int) -> None:
        self._discard()
        self._held.clear()
        super().finish(last_step)

    def metrics(self) -> dict[str, float]:
        return {"rows_held": self.rows_held, "rows_pulled": self.rows_pulled}
