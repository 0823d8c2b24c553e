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

The loop speaks :class:`TablesPipeline`: every step's unique keys, rows and gradients as a
dict per table; each step's commit covers all tables, and every table of a step is pulled in
one request per shard per ``--ps-max-keys-per-rpc`` keys (``TableReads``).
``CatchUpPipeline`` is per table for any job (the default job's one table in today's
one-table requests, so its bits and speed are today's).  The default job's other strategies
sit behind :class:`OneTable`; a job of several tables has :class:`TablesEarlyPullPipeline`
(the early pull per table) and otherwise :class:`TablesDirectPipeline` (each read waits for
the commit it depends on, t-1 or t-1-K, then pulls: the same rows, waiting where
``AsyncPrefetchPipeline``, a one-table strategy for now, would not).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import torch
from mpi4py import MPI

from cpu_dist.common.config import Config
from cpu_dist.common.contracts import TABLE
from cpu_dist.common.sorted_keys import find_sorted
from cpu_dist.common.timing import PhaseTimer
from cpu_dist.data import Dataset
from cpu_dist.sparse import Client, Handle
from cpu_dist.sparse.aggregation import make_aggregation
from cpu_dist.sparse.catch_up import RecentCommits
from cpu_dist.sparse.commits import CommitSession, SparseCommitter, make_handoff
from cpu_dist.sparse.reads import EarlyPull, TableReads, TablesPull, written_by

# Per table (the job's tables in their order): a step's sorted unique keys, or their rows.
TableKeys = Mapping[str, np.ndarray]
TableRows = dict[str, torch.Tensor]


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


class TablesPipeline(Protocol):
    """:class:`StepPipeline` over a job's tables: keys, rows and gradients per table."""

    prefetch_early: bool

    def read(self, step: int, unique: TableKeys) -> TableRows: ...

    def submit(self, step: int, keys: TableKeys, grads: TableKeys) -> None: ...

    def prefetch(self, step: int, unique: TableKeys) -> None: ...

    def wait_readable(self, step: int) -> None: ...

    def finish(self, last_step: int) -> None: ...

    def metrics(self) -> dict[str, float]: ...


class OneTable:
    """A one-table :class:`StepPipeline` as a :class:`TablesPipeline` of its table ``name``
    (the default job's fused table, the cache stage)."""

    def __init__(self, inner: StepPipeline, name: str) -> None:
        self.inner, self.name = inner, name
        self.prefetch_early = inner.prefetch_early

    def read(self, step: int, unique: TableKeys) -> TableRows:
        return {self.name: self.inner.read(step, unique[self.name])}

    def submit(self, step: int, keys: TableKeys, grads: TableKeys) -> None:
        self.inner.submit(step, keys[self.name], grads[self.name])

    def prefetch(self, step: int, unique: TableKeys) -> None:
        self.inner.prefetch(step, unique[self.name])

    def wait_readable(self, step: int) -> None:
        self.inner.wait_readable(step)

    def finish(self, last_step: int) -> None:
        self.inner.finish(last_step)

    def metrics(self) -> dict[str, float]:
        return self.inner.metrics()


class TablesDirectPipeline:
    """Several tables: each read waits for the commit it depends on, then pulls every table
    of the step in one request per shard per max-keys (``Client.pull_tables``); each step's
    gradients go out as one commit of every table (``SparseCommitter.submit_tables``)."""

    prefetch_early = False

    def __init__(
        self,
        reads: TableReads,
        committer: SparseCommitter,
        timer: PhaseTimer,
        dims: Mapping[str, int] | None = None,
    ) -> None:
        self.reads, self.committer, self.timer = reads, committer, timer
        self.dims = dict(dims or {})  # each table's width (the early pull's assembly)

    def read(self, step: int, unique: TableKeys) -> TableRows:
        with self.timer("commit_wait"):
            self.committer.wait_for_read(step)
        with self.timer("pull"):
            rows = self.reads.pull(unique)
        return {name: torch.from_numpy(rows[name]) for name in unique}

    def submit(self, step: int, keys: TableKeys, grads: TableKeys) -> None:
        self.committer.submit_tables(step, {name: (keys[name], grads[name]) for name in keys})

    def prefetch(self, step: int, unique: TableKeys) -> None:
        pass

    def wait_readable(self, step: int) -> None:
        self.committer.wait_readable(step)

    def finish(self, last_step: int) -> None:
        self.committer.finish(last_step)

    def metrics(self) -> dict[str, float]:
        return {}


class TablesEarlyPullPipeline(TablesDirectPipeline):
    """:class:`EarlyPullPipeline` for several tables: as soon as step t+1's keys are known,
    every table's rows that step t did not write are pulled in one request (its written rows
    per table come from the step's id exchange); at the read, after commit t, the rows it
    wrote, again in one request for all tables."""

    def __init__(
        self,
        reads: TableReads,
        committer: SparseCommitter,
        timer: PhaseTimer,
        timeout_s: float,
        dims: Mapping[str, int],
    ) -> None:
        super().__init__(reads, committer, timer, dims)
        self.timeout_s = timeout_s
        # (step, unique keys, rows written by step-1 per table, the pull of the others)
        self._early: tuple[int, dict[str, np.ndarray], dict[str, np.ndarray], TablesPull] | None
        self._early = None

    def prefetch(self, step: int, unique: TableKeys) -> None:
        written = self.committer.written_tables
        dependent = {n: written_by(u, written.get(n)) for n, u in unique.items()}
        pull = self.reads.pull_async({n: u[~dependent[n]] for n, u in unique.items()})
        self._early = (step, dict(unique), dependent, pull)

    def read(self, step: int, unique: TableKeys) -> TableRows:
        early, self._early = self._early, None
        if early is not None and (
            early[0] != step
            or early[1].keys() != unique.keys()
            or any(not np.array_equal(early[1][n], unique[n]) for n in unique)
        ):
            early[3].wait(self.timeout_s)  # a hint for another step: let it end
            early = None
        if early is None:
            return super().read(step, unique)
        _, _, dependent, pull = early
        with self.timer("commit_wait"):
            self.committer.wait_for_read(step)  # commit step-1: the rows it wrote
        with self.timer("pull"):
            late = self.reads.pull({n: u[dependent[n]] for n, u in unique.items()})
            independent = pull.wait(self.timeout_s)
            out = {}
            for name, keys in unique.items():
                rows = np.empty((len(keys), self.dims[name]), dtype=np.float32)
                rows[dependent[name]] = late[name]
                rows[~dependent[name]] = independent[name]
                out[name] = torch.from_numpy(rows)
        return out

    def finish(self, last_step: int) -> None:
        if self._early is not None:  # a hint for a step that never ran
            self._early[3].wait(self.timeout_s)
            self._early = None
        super().finish(last_step)


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
class _Kept:
    """One table's rows of step ``step`` kept from the last reads (each as after its ``held``
    commit); the others are being pulled."""

    kept: np.ndarray  # bool per key of the table's unique keys
    rows: np.ndarray  # the kept rows (a copy)
    held: np.ndarray  # the job step each kept row is as after
    states: np.ndarray | None  # and their optimizer states (Adagrad's)


@dataclass
class _Ahead:
    """Step ``step``'s rows on their way: per table those kept, and one pull of the rest."""

    step: int
    unique: dict[str, np.ndarray]
    kept: dict[str, _Kept]
    pull: TablesPull  # unique[t][~kept[t].kept] of every table t


@dataclass(frozen=True)
class _Recent:
    """Rows of the last reads of one table (sorted keys), each as after commit ``held``."""

    keys: np.ndarray
    rows: np.ndarray
    held: np.ndarray
    states: np.ndarray | None


# A pull's rows of one table (writable), each row's last commit as a job step, its states.
_Landed = tuple[np.ndarray, np.ndarray, np.ndarray | None]


@dataclass(frozen=True)
class CatchUpTable:
    """What the catch-up needs of a table: its width, optimizer, lr and eps."""

    name: str
    dim: int
    optimizer: str
    lr: float
    eps: float = 1e-8


class CatchUpPipeline:
    """``--sparse-sync pipelined`` or ``async`` (any K) under collective aggregation without
    table rules, for any number of tables.  As soon as step t's read returned, step t+1's rows
    are pulled, with each row's last commit (``row_steps``), except the rows the last K+1 reads
    read, which the worker keeps.  At the read it applies the commits the rows miss from the
    summed gradients it keeps (:class:`RecentCommits`, one per table), with the shard's
    arithmetic, and waits for no commit: rows whose reply holds a commit older than those kept
    are pulled again after commit t-K (K=0 when pipelined; the hand-off, on its own thread,
    waits for it too).  So the link is off the critical path, fewer rows cross it, and the rows
    equal the barrier mode's bit for bit.  Every table's rows of a step travel in one pull
    (:class:`TableReads`: the default job's one table in today's one-table requests)."""

    prefetch_early = True

    def __init__(
        self,
        reads: TableReads,
        committer: SparseCommitter,
        timer: PhaseTimer,
        timeout_s: float,
        compression: Literal["none", "fp16", "int8"],
        tables: Sequence[CatchUpTable],
    ) -> None:
        self.reads, self.committer, self.timer = reads, committer, timer
        self.timeout_s = timeout_s
        session = committer.session
        self.tables = {t.name: t for t in tables}
        self.with_states = any(t.optimizer != "sgd" for t in tables)
        self.recent = {
            t.name: RecentCommits(
                committer.handoff.staleness + 2,
                t.lr,
                t.optimizer,
                session.world,
                compression,
                t.eps,
            )
            for t in tables
        }
        self.depth = committer.handoff.staleness + 2
        self._ahead: _Ahead | None = None
        self._recent: dict[str, _Recent] = {}
        self.rows_caught_up = self.rows_pulled_again = self.rows_kept = 0
        self.lag: list[int] = []  # per read: commits the oldest of its rows missed

    def _pull(self, parts: Mapping[str, np.ndarray]) -> TablesPull:
        sid = self.committer.session.id
        return self.reads.pull_async(
            parts, session=sid, row_steps=True, row_states=self.with_states
        )

    def _stateful(self, name: str) -> bool:
        return self.tables[name].optimizer != "sgd"

    def _empty_states(self, name: str, n: int) -> np.ndarray | None:
        t = self.tables[name]
        if t.optimizer == "sgd":
            return None
        shape = (n, t.dim) if t.optimizer == "adagrad" else (n,)
        return np.empty(shape, dtype=np.float32)

    def prefetch(self, step: int, unique: TableKeys) -> None:
        kept: dict[str, _Kept] = {}
        for name, keys in unique.items():
            mask = np.zeros(len(keys), dtype=bool)
            rows = np.empty((0, self.tables[name].dim), np.float32)
            held, states = np.empty(0, np.int64), self._empty_states(name, 0)
            r = self._recent.get(name)
            if r is not None:
                at, mask = find_sorted(r.keys, keys)
                # only rows the kept steps can bring to step-1 (at the read: steps step-depth..)
                mask[mask] = r.held[at[mask]] >= step - self.depth - 1
                rows, held = r.rows[at[mask]], r.held[at[mask]]
                states = None if r.states is None else r.states[at[mask]]
            kept[name] = _Kept(mask, rows, held, states)
        unique = dict(unique)
        self._ahead = _Ahead(
            step, unique, kept, self._pull({n: unique[n][~kept[n].kept] for n in unique})
        )

    def _remember(
        self, step: int, name: str, unique: np.ndarray, rows: np.ndarray, states: np.ndarray | None
    ) -> None:
        """Add table ``name``'s rows read at ``step`` (as after commit step-1) to the recent
        ones, dropping what the kept steps will no longer cover."""
        held = np.full(len(unique), step - 1, dtype=np.int64)
        r = self._recent.get(name)
        if r is not None:
            old = ~find_sorted(unique, r.keys)[1] & (r.held >= step - self.depth)
            keys = np.concatenate([unique, r.keys[old]])
            order = np.argsort(keys, kind="stable")
            unique, rows = keys[order], np.concatenate([rows, r.rows[old]])[order]
            held = np.concatenate([held, r.held[old]])[order]
            if states is not None and r.states is not None:
                states = np.concatenate([states, r.states[old]])[order]
        self._recent[name] = _Recent(unique, rows, held, states)

    def submit(self, step: int, keys: TableKeys, grads: TableKeys) -> None:
        out = self.committer.submit_tables(step, {n: (keys[n], grads[n]) for n in keys})
        for name, o in out.items():
            assert o.written is not None and o.summed is not None  # collective aggregation
            self.recent[name].add(step, o.written, o.summed)

    def read(self, step: int, unique: TableKeys) -> TableRows:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and (
            ahead.step != step
            or ahead.unique.keys() != unique.keys()
            or any(not np.array_equal(ahead.unique[n], unique[n]) for n in unique)
        ):
            ahead.pull.wait(self.timeout_s)  # a hint for another step: let it end
            ahead = None
        with self.timer("pull"):
            got = self._assemble(unique, ahead)
            stale = {n: np.flatnonzero(~self.recent[n].covers(got[n][1], step - 1)) for n in unique}
            if any(len(s) for s in stale.values()):
                # older than the kept steps: pulled again once commit step-1-K is applied
                # (the kept steps cover the rest)
                self.rows_pulled_again += sum(len(s) for s in stale.values())
                with self.timer("commit_wait"):
                    self.committer.wait_for_read(step, record=False)
                again = self._landed(
                    self._pull({n: unique[n][s] for n, s in stale.items() if len(s)})
                )
                for name, (rows_, held_, fresh_states) in again.items():
                    s = stale[name]
                    rows, held, states = got[name]
                    rows[s], held[s] = rows_, held_
                    if states is not None and fresh_states is not None:
                        states[s] = fresh_states
            oldest = [int(h.min()) for _, h, _ in got.values() if len(h)]
            self.lag.append(max(0, step - 1 - min(oldest)) if oldest else 0)
            for name, (rows, held, states) in got.items():
                self.rows_caught_up += self.recent[name].apply(
                    unique[name], rows, held, step - 1, states
                )
        self.committer.caught_up_read()
        for name, (rows, _, states) in got.items():
            self._remember(step, name, unique[name], rows, states)
        return {name: torch.from_numpy(got[name][0]) for name in unique}

    def _assemble(self, unique: TableKeys, ahead: _Ahead | None) -> dict[str, _Landed]:
        """Per table: rows of its unique keys, each row's last commit as a job step, states."""
        if ahead is None:
            return self._landed(self._pull(unique))
        pulled = self._landed(ahead.pull)
        out: dict[str, _Landed] = {}
        for name, keys in unique.items():
            k = ahead.kept[name]
            self.rows_kept += int(k.kept.sum())
            rows = np.empty((len(keys), self.tables[name].dim), dtype=np.float32)
            held = np.empty(len(keys), dtype=np.int64)
            states = self._empty_states(name, len(keys))
            rows[k.kept], held[k.kept] = k.rows, k.held
            p_rows, p_held, p_states = pulled[name]
            rows[~k.kept], held[~k.kept] = p_rows, p_held
            if states is not None:
                assert k.states is not None and p_states is not None
                states[k.kept], states[~k.kept] = k.states, p_states
            out[name] = (rows, held, states)
        return out

    def _landed(self, pull: TablesPull) -> dict[str, _Landed]:
        """A pull's rows per table (writable), each row's last commit as a job step, its
        states (None for a table without optimizer state)."""
        rows = pull.wait(self.timeout_s)
        steps = pull.row_steps()
        states = pull.row_states() if self.with_states else None
        assert steps is not None
        base = self.committer.session.base
        out: dict[str, _Landed] = {}
        for name, r in rows.items():
            s = steps[name]
            # session steps -> job steps (int64 min, "no bound", stays below every step)
            held = np.where(s == np.iinfo(np.int64).min, s, s + base)
            st = None
            if states is not None and self._stateful(name):
                st = np.ascontiguousarray(states[name], dtype=np.float32)
            out[name] = (r, held, st)
        return out

    def wait_readable(self, step: int) -> None:
        self.committer.wait_readable(step)

    def finish(self, last_step: int) -> None:
        if self._ahead is not None:  # a hint for a step that never ran
            self._ahead.pull.wait(self.timeout_s)
            self._ahead = None
        self.committer.finish(last_step)

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
        and not any(t.expire_after for t in cfg.tables.tables)
        and not _catch_up(cfg)
    )


def _async_prefetch(cfg: Config) -> bool:
    return (
        cfg.cache is None
        and cfg.tables.fused
        and cfg.train.sparse_sync == "async"
        and cfg.train.max_staleness > 0
    )


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
        and not any(t.has_rules for t in cfg.tables.tables)
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
        table_lrs=None if cfg.tables.fused else {t.name: t.lr for t in cfg.tables.tables},
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
) -> TablesPipeline:
    """The one place that chooses a strategy from the flags (and the job's tables)."""
    if _catch_up(cfg):
        tables = [CatchUpTable(t.name, t.dim, t.optimizer, t.lr, t.eps) for t in cfg.tables.tables]
        if cfg.tables.fused:  # the session's one-table form: its lr and optimizer
            tables = [
                CatchUpTable(TABLE, client.dim, cfg.train.sparse_optimizer, cfg.train.sparse_lr)
            ]
        reads = TableReads(client, [t.name for t in tables], one_table=cfg.tables.fused)
        return CatchUpPipeline(
            reads, committer, timer, cfg.client.rpc_timeout_s, cfg.client.compression, tables
        )
    if not cfg.tables.fused:
        reads = TableReads(client, cfg.tables.names, False)
        if _early_pull(cfg):
            return TablesEarlyPullPipeline(
                reads, committer, timer, cfg.client.rpc_timeout_s, cfg.tables.dims
            )
        return TablesDirectPipeline(reads, committer, timer)
    return OneTable(_one_table_pipeline(cfg, client, committer, comm, dataset, timer), TABLE)


def _one_table_pipeline(
    cfg: Config,
    client: Client,
    committer: SparseCommitter,
    comm: MPI.Intracomm,
    dataset: Dataset,
    timer: PhaseTimer,
) -> StepPipeline:
    if cfg.cache is not None:
        from gpu_cache import make_reader

        return make_reader(cfg, client, committer, comm, dataset, timer)
    if _early_pull(cfg):
        return EarlyPullPipeline(client, committer, timer, cfg.client.rpc_timeout_s)
    if _async_prefetch(cfg):
        # with expiry a commit may drop any row: then every row counts as written
        known = not cfg.table.expire_after
        return AsyncPrefetchPipeline(client, committer, timer, cfg.client.rpc_timeout_s, known)
    return DirectPipeline(client, committer, timer)
