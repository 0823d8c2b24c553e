"""Reads that wait for no commit: the worker brings the rows up to date itself.

Under collective aggregation every worker holds each step's summed gradients, so the rows of
step t+1 may be pulled during the whole of step t and the commits they miss applied on the
worker (``cpu_dist.sparse.catch_up``), with the shard's arithmetic: the rows equal the
barrier mode's bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from cpu_dist.common.sorted_keys import find_sorted
from cpu_dist.common.timing import PhaseTimer
from cpu_dist.sparse.catch_up import RecentCommits
from cpu_dist.sparse.commits import SparseCommitter
from cpu_dist.sparse.reads import TableReads, TablesPull
from cpu_dist.train.pipelines.base import TableKeys, TableRows


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
                session.schedule,  # the rates the step's commit carried
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
