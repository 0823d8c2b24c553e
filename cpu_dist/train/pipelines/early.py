"""Reads that start before the commit they depend on (``cpu_dist.sparse.reads``, rule 1).

``EarlyPullPipeline``     pipelined commits under ps aggregation, without expiry: the next
                          step's rows that this step did not write are pulled during the dense
                          phase, the rest in a pull started then too that the shards answer
                          once the commit is applied, each in one request for all tables.
``AsyncPrefetchPipeline`` ``--sparse-sync async`` with K >= 1: the same early pull names the
                          commit session, so the shards' reply says whether its rows hold
                          every commit the staleness bound needs; the read waits only for
                          commit t-1-K.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from cpu_dist.common.timing import PhaseTimer
from cpu_dist.sparse.commits import SparseCommitter
from cpu_dist.sparse.reads import AfterCommit, EarlyPull, TableReads
from cpu_dist.train.pipelines.base import DirectPipeline, TableKeys, TableRows, tensors


class HintPipeline(DirectPipeline):
    """A :class:`DirectPipeline` that holds one :class:`EarlyPull` (a hint) at a time."""

    def __init__(
        self,
        reads: TableReads,
        committer: SparseCommitter,
        timer: PhaseTimer,
        dims: Mapping[str, int],
        timeout_s: float,
    ) -> None:
        super().__init__(reads, committer, timer, dims)
        self.timeout_s = timeout_s
        self._early: EarlyPull | None = None

    def _take(self, step: int, unique: TableKeys) -> EarlyPull | None:
        """The early pull for this read, or None (after letting a pull for another one end)."""
        early, self._early = self._early, None
        if early is not None and not early.matches(step, unique):
            early.discard(self.timeout_s)  # a hint for another step
            return None
        return early

    def finish(self, last_step: int) -> None:
        if self._early is not None:  # a hint for a step that never ran
            self._early.discard(self.timeout_s)
            self._early = None
        super().finish(last_step)


class EarlyPullPipeline(HintPipeline):
    """As soon as step t+1's keys are known (after step t's hand-off), every table's rows
    that step t did not write are pulled (its written rows per table come from the step's id
    exchange), and so are the rows it wrote, in a pull that every shard parks until it has
    applied commit t: the read waits for that reply alone, with no wait for the commit and no
    round trip after it."""

    def prefetch(self, step: int, unique: TableKeys) -> None:
        session = self.committer.session
        after = AfterCommit(session.id, session.session_step(step - 1), session.barrier_timeout_s)
        self._early = EarlyPull(
            self.reads, step, unique, self.written, self.dims, after_commit=after
        )

    def read(self, step: int, unique: TableKeys) -> TableRows:
        early = self._take(step, unique)
        if early is None:
            return super().read(step, unique)
        with self.timer("commit_wait"):  # commit step-1, with the rows it wrote
            late = self.committer.read_with_commit(step, lambda: early.wait_late(self.timeout_s))
        with self.timer("pull"):
            return tensors(unique, early.combine(late, early.early.wait(self.timeout_s)))


class AsyncPrefetchPipeline(HintPipeline):
    """``--sparse-sync async`` with K >= 1.  Step t+1's rows that step t does not write are
    pulled as soon as its keys are known (during step t), naming the commit session so that
    each shard's reply says which commits they hold; at the read, the worker waits only for
    commit t-K (the asynchronous rule: usually no wait, one round trip that also learns how
    far the shards are) and pulls the rows step t writes.  So a read waits for no other
    worker, yet holds commit t whenever it is applied by then (the staleness metrics say how
    often it was not).  Early rows that miss a commit the rule needs are pulled again.
    ``unknown_writes``: tables whose commits may write rows no worker knows of (expiry drops
    them), so every row of theirs counts as written."""

    def __init__(
        self,
        reads: TableReads,
        committer: SparseCommitter,
        timer: PhaseTimer,
        dims: Mapping[str, int],
        timeout_s: float,
        unknown_writes: Collection[str] = (),
    ) -> None:
        super().__init__(reads, committer, timer, dims, timeout_s)
        self.unknown_writes = frozenset(unknown_writes)
        self.reads_early = self.reads_again = 0  # early pulls used / pulled again

    def prefetch(self, step: int, unique: TableKeys) -> None:
        self.committer.drain()
        written = {n: w for n, w in self.written.items() if n not in self.unknown_writes}
        session = self.committer.session.id
        self._early = EarlyPull(self.reads, step, unique, written, self.dims, session=session)

    def read(self, step: int, unique: TableKeys) -> TableRows:
        early = self._take(step, unique)
        if early is None:
            return super().read(step, unique)
        with self.timer("commit_wait"):
            self.committer.wait_for_read(step)  # commit step-1-K; records the staleness
        with self.timer("pull"):
            late = self.reads.pull(early.part(written=True))
            rows = early.early.wait(self.timeout_s)
            # Rows step-1 does not write are as after commit step-1 once they hold step-2;
            # else they hold what the shards had applied when they were pulled.
            seen = early.early.committed_step()
            held = step - 1 if seen is None else self.committer.session.base + seen
            if held < step - 2 and held < step - 1 - self.committer.handoff.staleness:
                self.reads_again += 1
                rows = self.reads.pull(early.part(written=False))
            else:
                self.reads_early += 1
                if held < step - 2:  # staler than the shards' commit the wait learned
                    self.committer.staler_read(step, held)
            return tensors(unique, early.combine(late, rows))

    def metrics(self) -> dict[str, float]:
        return {"reads_early": self.reads_early, "reads_pulled_again": self.reads_again}
