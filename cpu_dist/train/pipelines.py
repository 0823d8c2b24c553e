"""How a worker reads a step's rows and hands off its sparse gradients: one small interface,
several strategies, so the training loop never branches on modes.

``DirectPipeline``    waits for the previous step's commit (with ``--sparse-sync async``, for
                      commit t-1-K only), then pulls every row.
``EarlyPullPipeline`` with pipelined commits (ps aggregation): the next step's rows that
                      this step did not write are pulled during the dense phase
                      (``cpu_dist.sparse.reads``).
``AsyncPrefetchPipeline`` with ``--sparse-sync async`` and K >= 1: the next step's rows are
                      all pulled during the dense phase; the shards' replies say whether they
                      hold every commit the staleness bound needs.
``CatchUpPipeline``   under collective aggregation, pipelined or async: the next step's rows
                      are pulled during the whole step, and the worker applies the commits
                      they miss itself (``cpu_dist.sparse.catch_up``), so reads see every
                      earlier step and wait for no commit.
the cache stage       ``gpu_cache.CachedRowReader`` (``--read-mode bagpipe``): a bounded row
                      cache in front of the PS, kept coherent with it.

Like TorchRec's train pipelines behind ``progress()``, each owns the sparse half of a step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import torch
from mpi4py import MPI

from cpu_dist.common.config import Config
from cpu_dist.common.sorted_keys import find_sorted
from cpu_dist.common.timing import PhaseTimer
from cpu_dist.data import Dataset
from cpu_dist.sparse import Client, Handle
from cpu_dist.sparse.aggregation import make_aggregation
from cpu_dist.sparse.catch_up import RecentCommits
from cpu_dist.sparse.commits import CommitSession, SparseCommitter, make_handoff
from cpu_dist.sparse.reads import EarlyPull, written_by


class StepPipeline(Protocol):
    # True: ``prefetch(step + 1)`` as soon as ``read(step)`` returned (before forward);
    # False: after ``submit(step)`` (a pipeline that needs the rows step writes).
    prefetch_early: bool

    def read(self, step: int, unique: np.ndarray) -> torch.Tensor:
        """Rows of ``unique`` (sorted int64) as after every commit before ``step``."""
        ...

    def submit(self, step: int, keys: np.ndarray, grads: np.ndarray) -> None:
        """Hand ``step``'s gradients of these rows to the PS."""
        ...

    def prefetch(self, step: int, unique: np.ndarray) -> None:
        """A hint: ``step``'s keys are known already (called after ``submit(step - 1)``)."""
        ...

    def wait_readable(self, step: int) -> None:
        """Block until every step before ``step`` is applied (evaluation, checkpoints)."""
        ...

    def finish(self, last_step: int) -> None:
        """Wait for the last commit, close the session and stop background work."""
        ...

    def metrics(self) -> dict[str, float]: ...


class DirectPipeline:
    prefetch_early = False

    def __init__(self, client: Client, committer: SparseCommitter, timer: PhaseTimer) -> None:
        self.client, self.committer, self.timer = client, committer, timer

    def read(self, step: int, unique: np.ndarray) -> torch.Tensor:
        with self.timer("commit_wait"):
            self.committer.wait_for_read(step)
        with self.timer("pull"):
            return torch.from_numpy(self.client.pull(unique))

    def submit(self, step: int, keys: np.ndarray, grads: np.ndarray) -> None:
        self.committer.submit(step, keys, grads)

    def prefetch(self, step: int, unique: np.ndarray) -> None:
        pass

    def wait_readable(self, step: int) -> None:
        self.committer.wait_readable(step)

    def finish(self, last_step: int) -> None:
        self.committer.finish(last_step)

    def metrics(self) -> dict[str, float]:
        return {}


class EarlyPullPipeline(DirectPipeline):
    def __init__(
        self, client: Client, committer: SparseCommitter, timer: PhaseTimer, timeout_s: float
    ) -> None:
        super().__init__(client, committer, timer)
        self.timeout_s = timeout_s
        self._early: EarlyPull | None = None

    def prefetch(self, step: int, unique: np.ndarray) -> None:
        self._early = EarlyPull(self.client, self.committer, step, unique, self.committer.written)

    def read(self, step: int, unique: np.ndarray) -> torch.Tensor:
        early, self._early = self._early, None
        if early is None or early.step != step:
            return super().read(step, unique)
        with self.timer("commit_wait"):
            self.committer.wait_for_read(step)
        with self.timer("pull"):
            return torch.from_numpy(early.finish(self.timeout_s))

    def finish(self, last_step: int) -> None:
        if self._early is not None:  # a hint for a step that never ran
            self._early.discard(self.timeout_s)
            self._early = None
        super().finish(last_step)


class AsyncPrefetchPipeline(DirectPipeline):
    """``--sparse-sync async`` with K >= 1.  Step t+1's rows that step t does not write are
    pulled as soon as its keys are known (during step t), naming the commit session so that
    each shard's reply says which commits they hold; at the read, the worker waits only for
    commit t-K (the asynchronous rule: usually no wait, one round trip that also learns how
    far the shards are) and pulls the rows step t writes.  So a read waits for no other
    worker, yet holds commit t whenever it is applied by then (the staleness metrics say how
    often it was not).  Early rows that miss a commit the rule needs are pulled again."""

    def __init__(
        self,
        client: Client,
        committer: SparseCommitter,
        timer: PhaseTimer,
        timeout_s: float,
        writes_known: bool,
    ) -> None:
        super().__init__(client, committer, timer)
        self.timeout_s, self.writes_known = timeout_s, writes_known
        self._early: tuple[int, np.ndarray, np.ndarray, Handle] | None = None
        self.reads_early = self.reads_again = 0  # early rows used / pulled again

    def prefetch(self, step: int, unique: np.ndarray) -> None:
        self.committer.drain()
        written = self.committer.written if self.writes_known else None
        dependent = written_by(unique, written)
        handle = self.client.pull_async(unique[~dependent], session=self.committer.session.id)
        self._early = (step, unique, dependent, handle)

    def read(self, step: int, unique: np.ndarray) -> torch.Tensor:
        early, self._early = self._early, None
        if early is None or early[0] != step or not np.array_equal(early[1], unique):
            if early is not None:
                early[3].wait(self.timeout_s)  # a hint for another step: let it end
            return super().read(step, unique)
        _, _, dependent, handle = early
        with self.timer("commit_wait"):
            self.committer.wait_for_read(step)  # commit step-1-K; records the staleness
        with self.timer("pull"):
            rows = np.empty((len(unique), self.client.dim), dtype=np.float32)
            rows[dependent] = self.client.pull(unique[dependent])
            rows[~dependent] = handle.wait(self.timeout_s)
            # Rows step-1 does not write are as after commit step-1 once they hold step-2;
            # else they hold what the shards had applied when they were pulled.
            seen = handle.committed_step()
            held = step - 1 if seen is None else self.committer.session.base + seen
            if held < step - 2 and held < step - 1 - self.committer.handoff.staleness:
                self.reads_again += 1
                rows[~dependent] = self.client.pull(unique[~dependent])
            else:
                self.reads_early += 1
                if held < step - 2:  # staler than the shards' commit the wait learned
                    self.committer.staler_read(step, held)
        return torch.from_numpy(rows)

    def finish(self, last_step: int) -> None:
        if self._early is not None:  # a hint for a step that never ran
            self._early[3].wait(self.timeout_s)
            self._early = None
        super().finish(last_step)

    def metrics(self) -> dict[str, float]:
        return {"reads_early": self.reads_early, "reads_pulled_again": self.reads_again}


@dataclass
class _Ahead:
    """Step ``step``'s rows on their way: those of the last reads kept (each as after its
    ``held`` commit), the others being pulled."""

    step: int
    unique: np.ndarray
    kept: np.ndarray  # bool per key of unique
    rows: np.ndarray  # the kept rows (a copy)
    held: np.ndarray  # the job step each kept row is as after
    states: np.ndarray | None  # and their optimizer states (row-wise Adagrad)
    handle: Handle  # the pull of unique[~kept]


@dataclass(frozen=True)
class _Recent:
    """Rows of the last reads (sorted keys), each as after commit ``held``."""

    keys: np.ndarray
    rows: np.ndarray
    held: np.ndarray
    states: np.ndarray | None


class CatchUpPipeline(DirectPipeline):
    """``--sparse-sync pipelined`` or ``async`` (any K) under collective aggregation without
    table rules.  As soon as step t's read returned, step t+1's rows are pulled, with each
    row's last commit (``row_steps``), except the rows the last K+1 reads read, which the
    worker keeps.  At the read it applies the commits the rows miss from the summed gradients
    it keeps (:class:`RecentCommits`), with the shard's arithmetic, and waits for no commit:
    rows whose reply holds a commit older than those kept are pulled again after commit t-K
    (K=0 when pipelined; the hand-off, on its own thread, waits for it too).  So the link is
    off the critical path, fewer rows cross it, and the rows equal the barrier mode's bit for
    bit."""

    prefetch_early = True

    def __init__(
        self,
        client: Client,
        committer: SparseCommitter,
        timer: PhaseTimer,
        timeout_s: float,
        compression: Literal["none", "fp16", "int8"],
    ) -> None:
        super().__init__(client, committer, timer)
        self.timeout_s = timeout_s
        session = committer.session
        self.adagrad = session.optimizer != "sgd"
        self.recent = RecentCommits(
            committer.handoff.staleness + 2,
            session.lr,
            session.optimizer,
            session.world,
            compression,
        )
        self._ahead: _Ahead | None = None
        self._recent: _Recent | None = None
        self.rows_caught_up = self.rows_pulled_again = self.rows_kept = 0
        self.lag: list[int] = []  # per read: commits the oldest of its rows missed

    def _pull(self, keys: np.ndarray) -> Handle:
        sid = self.committer.session.id
        return self.client.pull_async(keys, session=sid, row_steps=True, row_states=self.adagrad)

    def prefetch(self, step: int, unique: np.ndarray) -> None:
        kept = np.zeros(len(unique), dtype=bool)
        rows, held = np.empty((0, self.client.dim), np.float32), np.empty(0, np.int64)
        states = None
        r = self._recent
        if r is not None:
            at, kept = find_sorted(r.keys, unique)
            # only rows the kept steps can bring to step-1 (at the read: steps step-depth..)
            kept[kept] = r.held[at[kept]] >= step - self.recent.depth - 1
            rows, held = r.rows[at[kept]], r.held[at[kept]]
            states = None if r.states is None else r.states[at[kept]]
        self._ahead = _Ahead(step, unique, kept, rows, held, states, self._pull(unique[~kept]))

    def _remember(
        self, step: int, unique: np.ndarray, rows: np.ndarray, states: np.ndarray | None
    ) -> None:
        """Add the rows read at ``step`` (as after commit step-1) to the recent ones, dropping
        what the kept steps will no longer cover."""
        held = np.full(len(unique), step - 1, dtype=np.int64)
        r = self._recent
        if r is not None:
            old = ~find_sorted(unique, r.keys)[1] & (r.held >= step - self.recent.depth)
            keys = np.concatenate([unique, r.keys[old]])
            order = np.argsort(keys, kind="stable")
            unique, rows = keys[order], np.concatenate([rows, r.rows[old]])[order]
            held = np.concatenate([held, r.held[old]])[order]
            if states is not None and r.states is not None:
                states = np.concatenate([states, r.states[old]])[order]
        self._recent = _Recent(unique, rows, held, states)

    def submit(self, step: int, keys: np.ndarray, grads: np.ndarray) -> None:
        out = self.committer.submit(step, keys, grads)
        assert out.written is not None and out.summed is not None  # collective aggregation
        self.recent.add(step, out.written, out.summed)

    def read(self, step: int, unique: np.ndarray) -> torch.Tensor:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and (ahead.step != step or not np.array_equal(ahead.unique, unique)):
            ahead.handle.wait(self.timeout_s)  # a hint for another step: let it end
            ahead = None
        with self.timer("pull"):
            rows, held, states = self._assemble(step, unique, ahead)
            stale = np.flatnonzero(~self.recent.covers(held, step - 1))
            if len(stale):  # older than the kept steps: pulled again once commit step-1-K is
                self.rows_pulled_again += len(stale)  # applied (the kept steps cover the rest)
                with self.timer("commit_wait"):
                    self.committer.wait_for_read(step, record=False)
                again = self._pull(unique[stale])
                rows[stale], held[stale], fresh_states = self._landed(again)
                if states is not None and fresh_states is not None:
                    states[stale] = fresh_states
            self.lag.append(int(max(0, step - 1 - held.min())) if len(held) else 0)
            self.rows_caught_up += self.recent.apply(unique, rows, held, step - 1, states)
        self.committer.caught_up_read()
        self._remember(step, unique, rows, states)
        return torch.from_numpy(rows)

    def _assemble(
        self, step: int, unique: np.ndarray, ahead: _Ahead | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Rows of ``unique``, each row's last commit as a job step, their states."""
        if ahead is None:
            return self._landed(self._pull(unique))
        kept = ahead.kept
        self.rows_kept += int(kept.sum())
        rows = np.empty((len(unique), self.client.dim), dtype=np.float32)
        held = np.empty(len(unique), dtype=np.int64)
        states = np.empty(len(unique), dtype=np.float32) if self.adagrad else None
        rows[kept], held[kept] = ahead.rows, ahead.held
        rows[~kept], held[~kept], pulled_states = self._landed(ahead.handle)
        if states is not None:
            assert ahead.states is not None and pulled_states is not None
            states[kept], states[~kept] = ahead.states, pulled_states
        return rows, held, states

    def _landed(self, handle: Handle) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """A pull's rows (writable), each row's last commit as a job step, its states."""
        rows = handle.wait(self.timeout_s)
        steps = handle.row_steps()
        assert steps is not None
        # session steps -> job steps (int64 min, "no bound", stays below every step)
        held = np.where(steps == np.iinfo(np.int64).min, steps, steps + self.committer.session.base)
        return rows, held, handle.row_states()

    def finish(self, last_step: int) -> None:
        if self._ahead is not None:  # a hint for a step that never ran
            self._ahead.handle.wait(self.timeout_s)
            self._ahead = None
        super().finish(last_step)

    def metrics(self) -> dict[str, float]:
        lag = self.lag
        return {
            "rows_caught_up": self.rows_caught_up,
            "rows_kept": self.rows_kept,
            "reads_pulled_again_rows": self.rows_pulled_again,
            "pull_lag_max": max(lag, default=0),
            "pull_lag_mean": sum(lag) / len(lag) if lag else 0.0,
        }


def _early_pull(cfg: Config) -> bool:
    """Rows the last step did not write may be pulled early, unless expiry can drop them at
    its commit (a drop is a write of that step that no worker knows of in advance)."""
    return (
        cfg.cache is None
        and cfg.train.sparse_sync == "pipelined"
        and not cfg.table.expire_after
        and not _catch_up(cfg)
    )


def _async_prefetch(cfg: Config) -> bool:
    return cfg.cache is None and cfg.train.sparse_sync == "async" and cfg.train.max_staleness > 0


def _catch_up(cfg: Config) -> bool:
    """Pipelined and async reads can be brought up to date on the worker instead of waiting
    for commits: it holds every step's summed gradients (collective aggregation) and no table
    rule decides at the shard what a commit touches."""
    return (
        cfg.cache is None
        and cfg.train.sparse_sync in ("pipelined", "async")
        and cfg.train.aggregation == "collective"
        and not cfg.table.admit_after
        and not cfg.table.expire_after
    )


def make_committer(
    cfg: Config, client: Client, comm: MPI.Intracomm, session_id: int
) -> SparseCommitter:
    """The worker side of the commit protocol for these flags."""
    session = CommitSession(
        client,
        session_id,
        comm.Get_rank(),
        comm.Get_size(),
        lr=cfg.train.sparse_lr,
        optimizer=cfg.train.sparse_optimizer,
        barrier_timeout_s=cfg.job.barrier_timeout_s,
    )
    early_pull = _early_pull(cfg)
    staleness = cfg.train.max_staleness if cfg.train.sparse_sync == "async" else 0
    return SparseCommitter(
        session,
        # the early pulls need the rows each step writes (an allgather of its ids)
        make_aggregation(
            cfg.train.aggregation, comm, exchange_ids=early_pull or _async_prefetch(cfg)
        ),
        make_handoff(cfg.train.sparse_sync, session, cfg.client.rpc_timeout_s, staleness),
        # the cache and the catch-up keep their rows coherent, so the hand-off may overlap
        # the dense phase
        background=cfg.cache is not None or _catch_up(cfg),
    )


def make_pipeline(
    cfg: Config,
    client: Client,
    committer: SparseCommitter,
    comm: MPI.Intracomm,
    dataset: Dataset,
    timer: PhaseTimer,
) -> StepPipeline:
    """The one place that chooses a strategy from the flags."""
    if cfg.cache is not None:
        from gpu_cache import make_reader

        return make_reader(cfg, client, committer, comm, dataset, timer)
    if _early_pull(cfg):
        return EarlyPullPipeline(client, committer, timer, cfg.client.rpc_timeout_s)
    if _catch_up(cfg):
        return CatchUpPipeline(
            client, committer, timer, cfg.client.rpc_timeout_s, cfg.client.compression
        )
    if _async_prefetch(cfg):
        # with expiry a commit may drop any row: then every row counts as written
        known = not cfg.table.expire_after
        return AsyncPrefetchPipeline(client, committer, timer, cfg.client.rpc_timeout_s, known)
    return DirectPipeline(client, committer, timer)
