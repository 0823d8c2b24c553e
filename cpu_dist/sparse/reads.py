"""Reading rows while commits are still being applied: the two rules, written once.

1. A row that step t did not write holds the same value before and after commit t, so it may
   be pulled as soon as step t+1's keys are known (:func:`written_by`, :class:`EarlyPull`,
   every table of the step in one request).
2. A row whose last writer is step s may be read once commit s is applied
   (:func:`pull_when_applied`: the commit-dependency wait; or in one round trip, started
   before the commit, a pull the shards park until it is applied: :class:`AfterCommit`).

The early pulls (``cpu_dist/train/pipelines``) and the cache stage's demand reads and staging
all go through these.

:class:`TableReads` is the client's pulls over a job's tables in one shape (dicts per table),
whichever wire form they take: the default job's one table the one-table requests, a job of
several tables ``Client.pull_tables`` (one request per shard per max-keys for all tables).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from cpu_dist.sparse import Client, Handle, _ps_client


class AppliedWaiter(Protocol):
    def wait_applied(self, step: int) -> None: ...


def written_by(keys: np.ndarray, written: np.ndarray | None) -> np.ndarray:
    """Bool per key: step t wrote it (``written``: the sorted rows step t writes; None: unknown,
    so every row counts as written)."""
    if written is None:
        return np.ones(len(keys), dtype=bool)
    return _ps_client.mark_written(keys, written)  # find_sorted's answer, in one merge pass


def pull_when_applied(
    client: Client, commits: AppliedWaiter, keys: np.ndarray, step: int
) -> np.ndarray:
    """Rows of ``keys`` once commit ``step`` (their last writer, or later) is applied."""
    commits.wait_applied(step)
    return client.pull(keys)


@dataclass(frozen=True)
class AfterCommit:
    """A pull that each shard answers once step ``step`` of commit session ``session`` (the
    shards' count) is applied on it, waiting at most ``timeout_s`` (``PullCommitted``)."""

    session: int
    step: int
    timeout_s: float


class EarlyPull:
    """Step t+1's rows (``unique``: sorted keys per table) on their way: those step t did not
    write (``written``: its rows per table; a table missing or None: unknown, so all count as
    written) are pulled now in one request, in the background (the client releases the GIL);
    the rest once commit t is applied (:meth:`finish`), or, with ``after_commit``, in a pull
    started now too that the shards answer once commit t is applied (:meth:`wait_late`)."""

    def __init__(
        self,
        reads: TableReads,
        step: int,
        unique: Mapping[str, np.ndarray],
        written: Mapping[str, np.ndarray | None],
        dims: Mapping[str, int],
        *,
        session: int | None = None,
        earlier: Sequence[Mapping[str, np.ndarray]] = (),
        after_commit: AfterCommit | None = None,
    ) -> None:
        """``session``: name the commit session, so that the reply says which commits its
        shards hold (:meth:`TablesPull.committed_step`).  ``earlier``: the rows (per table) of
        steps before t whose commits may not be applied yet either: they count as written.
        ``after_commit``: commit t (the shards' step), for which the rows step t wrote are
        pulled now as well, parked on every shard until it is applied there."""
        self.reads, self.step, self.unique, self.dims = reads, step, dict(unique), dims
        self.dependent = {n: written_by(u, written.get(n)) for n, u in self.unique.items()}
        for rows in earlier:
            for n, u in self.unique.items():
                self.dependent[n] |= written_by(u, rows[n])
        self.early = reads.pull_async(self.part(written=False), session=session)
        self.after_commit = after_commit
        self.late: TablesPull | None = None
        if after_commit is not None:
            self.late = reads.pull_async(self.part(written=True), after_commit=after_commit)

    def part(self, written: bool) -> dict[str, np.ndarray]:
        """Per table, the keys step t wrote (``written``) or those it did not."""
        return {n: u[self.dependent[n] == written] for n, u in self.unique.items()}

    def matches(self, step: int, unique: Mapping[str, np.ndarray]) -> bool:
        """Whether this pull is the one a read of ``step`` of these keys needs."""
        return (
            self.step == step
            and self.unique.keys() == unique.keys()
            and all(np.array_equal(self.unique[n], unique[n]) for n in unique)
        )

    def combine(
        self, late: Mapping[str, np.ndarray], early: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """Every table's rows of ``unique`` from the written (``late``) and the other rows."""
        return {
            name: _ps_client.interleave_rows(self.dependent[name], late[name], early[name])
            for name in self.unique
        }

    def finish(self, commits: AppliedWaiter, timeout_s: float) -> dict[str, np.ndarray]:
        """Every row of ``unique``, as after commit ``step - 1``."""
        late = self.part(written=True)
        if any(len(k) for k in late.values()):  # (else no request at all)
            commits.wait_applied(self.step - 1)
            rows = self.reads.pull(late)
        else:
            rows = {n: np.empty((0, self.dims[n]), np.float32) for n in late}
        return self.combine(rows, self.early.wait(timeout_s))

    def wait_late(self, timeout_s: float) -> dict[str, np.ndarray]:
        """The rows step t wrote, once every shard applied commit t (``after_commit``); the
        reply's committed step proves it, else :class:`RuntimeError`."""
        assert self.late is not None and self.after_commit is not None, "no after_commit"
        rows = self.late.wait(self.after_commit.timeout_s + timeout_s)
        seen = self.late.committed_step()
        if seen is None or seen < self.after_commit.step:  # (every shard answers: never)
            raise RuntimeError(
                f"a pull after commit step {self.after_commit.step} of session "
                f"{self.after_commit.session} came back with committed step {seen}"
            )
        return rows

    def discard(self, timeout_s: float) -> None:
        """Let the early pulls end without using them (their step never ran)."""
        self.early.wait(timeout_s)
        if self.late is not None and self.after_commit is not None:
            self.late.wait(self.after_commit.timeout_s + timeout_s)


class TablesPull(Protocol):
    """A pull of several tables on its way (``_ps.TablesHandle``, or :class:`_OnePull`)."""

    def wait(self, timeout_s: float | None = None) -> dict[str, np.ndarray]: ...

    def committed_step(self) -> int | None: ...

    def row_steps(self) -> dict[str, np.ndarray] | None: ...

    def row_states(self) -> dict[str, np.ndarray] | None: ...


class _OnePull:
    """A one-table pull (``_ps.Handle``) in the shape of a tables pull."""

    def __init__(self, name: str, handle: Handle) -> None:
        self.name, self.handle = name, handle

    def wait(self, timeout_s: float | None = None) -> dict[str, np.ndarray]:
        return {self.name: self.handle.wait(timeout_s)}

    def committed_step(self) -> int | None:
        return self.handle.committed_step()

    def row_steps(self) -> dict[str, np.ndarray] | None:
        steps = self.handle.row_steps()
        return None if steps is None else {self.name: steps}

    def row_states(self) -> dict[str, np.ndarray] | None:
        states = self.handle.row_states()
        return None if states is None else {self.name: states}


class TableReads:
    """Pulls of a job's tables (``names``, in the job's order) as dicts per table.
    ``one_table``: the client's one table (a job without a job file): its one-table
    requests, today's wire form."""

    def __init__(self, client: Client, names: Sequence[str], one_table: bool) -> None:
        if one_table and len(names) != 1:
            raise ValueError(f"one_table reads need one table, got {list(names)}")
        self.client, self.names, self.one_table = client, tuple(names), one_table

    def pull_async(
        self,
        parts: Mapping[str, np.ndarray],
        *,
        session: int | None = None,
        row_steps: bool = False,
        row_states: bool = False,
        after_commit: AfterCommit | None = None,
    ) -> TablesPull:
        """Rows of ``parts`` (every table named, or only those with keys); with
        ``after_commit`` (it names the session) once that commit is applied."""
        after_step: int | None = None
        wait_timeout: float | None = None
        if after_commit is not None:
            session = after_commit.session
            after_step, wait_timeout = after_commit.step, after_commit.timeout_s
        if self.one_table:
            (name,) = self.names
            keys = parts.get(name, np.zeros(0, dtype=np.int64))
            handle = self.client.pull_async(
                keys,
                session=session,
                row_steps=row_steps,
                row_states=row_states,
                after_step=after_step,
                wait_timeout=wait_timeout,
            )
            return _OnePull(name, handle)
        request: dict[str, npt.ArrayLike] = dict(parts)
        return self.client.pull_tables_async(
            request,
            session=session,
            row_steps=row_steps,
            row_states=row_states,
            after_step=after_step,
            wait_timeout=wait_timeout,
        )

    def pull(self, parts: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Rows of every table of ``parts``, at once."""
        if self.one_table:
            (name,) = self.names
            return {name: self.client.pull(parts[name])}
        request: dict[str, npt.ArrayLike] = dict(parts)
        return self.client.pull_tables(request)


class OneTableReads:
    """One table of a :class:`TableReads` with a one-table client's ``pull(keys)``: what each
    table's cache of the cache stage reads its rows with (its staging and its checks)."""

    def __init__(self, reads: TableReads, name: str) -> None:
        self.reads, self.name = reads, name

    def pull(self, keys: np.ndarray) -> np.ndarray:
        return self.reads.pull({self.name: keys})[self.name]
