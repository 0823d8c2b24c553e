"""A worker's side of the ordered commit protocol (docs/DESIGN.md, "The commit protocol").

Three small parts, each one job:

- :class:`CommitSession`: the job's session on every shard, in job steps (a resumed job's
  first step is the session's step 0), and the wait until a step is applied.
- hand-off strategies (``--sparse-sync``): :class:`PipelinedHandoff` sends step t's chunks
  asynchronously, and the next hand-off (or a read that needs commit t) first collects their
  acknowledgements; :class:`BarrierHandoff` also waits until step t is applied.  With
  staleness K (``--sparse-sync async --max-staleness K``) a shard holds up to K+1 steps beyond
  its committed one, and a read of step t waits only for commit t-1-K; K=0 is the pipelined
  mode bit for bit.
- :class:`SparseCommitter`: per step, aggregation (``aggregation.py``) then the hand-off,
  optionally on a thread of its own (``background=True``, the cache stage: it keeps its rows
  coherent itself, so the hand-off may overlap the dense phase).  Every method that reads the
  protocol's state first drains that thread.

A job of several tables hands every table of a step over at once (``submit_tables``): its
chunks cover all of them (``Client.commit_tables_async``), so a shard applies the step to all
its tables together or not at all.  Each table's learning rate travels with its part; its
optimizer is its spec's, on the shard.

Either way step t+1 reads rows that hold every worker's step-t update: the synchronous
contract.  All waits are bounded: acknowledgements by ``--rpc-timeout``, commits (which need
every worker's chunks) by ``--barrier-timeout``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import numpy as np

from cpu_dist.common.schedule import CONSTANT, LrSchedule
from cpu_dist.sparse import Client, Handle
from cpu_dist.sparse.aggregation import Aggregation, Outgoing, TableOutgoing

# A step's sparse gradients per table: {table: (sorted unique keys, float32 grads [u, dim])}.
TableGrads = Mapping[str, tuple[np.ndarray, np.ndarray]]
_Rows = TypeVar("_Rows")


class WaitClock:
    """Seconds spent blocked on the protocol, summed over threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds


class CommitSession:
    """Job steps on the shards' session ``session_id``; safe to wait on from several threads."""

    def __init__(
        self,
        client: Client,
        session_id: int,
        rank: int,
        world: int,
        *,
        lr: float,
        optimizer: str,
        barrier_timeout_s: float,
        table_lrs: Mapping[str, float] | None = None,
        schedule: LrSchedule = CONSTANT,
    ) -> None:
        """``table_lrs``: a job of named tables, each table's learning rate (``lr`` and
        ``optimizer`` are then the one-table form's, unused by :meth:`send_tables`).
        ``schedule``: each step's chunks carry the scheduled rates of their job step."""
        self.client, self.id, self.rank, self.world = client, session_id, rank, world
        self.lr, self.optimizer, self.barrier_timeout_s = lr, optimizer, barrier_timeout_s
        self.table_lrs = dict(table_lrs or {})
        self.schedule = schedule
        self.base = 0  # the job step that is the session's step 0 (a resumed job's first)
        self.waits = WaitClock()
        self._lock = threading.Lock()
        self._committed = -1

    @property
    def committed(self) -> int:
        """The last job step known to be applied on every shard."""
        with self._lock:
            return self._committed

    def start_at(self, step: int) -> None:
        """A resumed job: ``step`` is the first step this session commits; everything before it
        is already in the restored rows."""
        with self._lock:
            self.base, self._committed = step, step - 1

    def session_step(self, step: int) -> int:
        """``step`` as the shards count it (what a Save checks its session against)."""
        return step - self.base

    def send(self, step: int, keys: np.ndarray, grads: np.ndarray, max_ahead: int = 1) -> Handle:
        """This worker's chunks of ``step`` (an empty marker chunk where it has no rows); a
        shard holds them if ``step`` is at most ``max_ahead`` beyond its committed step."""
        return self.client.commit_async(
            self.id,
            step - self.base,
            self.rank,
            self.world,
            keys,
            grads,
            self.schedule.rate(self.lr, step),
            self.optimizer,
            max_ahead=max_ahead,
            base_step=self.base,  # admission and expiry count job steps
        )

    def send_tables(self, step: int, parts: TableGrads, max_ahead: int = 1) -> Handle:
        """:meth:`send` of every table of ``step`` in one set of chunks (tables with no rows
        are named too, so every shard knows the step covers them)."""
        request: dict[str, Any] = {
            name: (keys, grads, self.schedule.rate(self.table_lrs[name], step))
            for name, (keys, grads) in parts.items()
        }
        return self.client.commit_tables_async(
            self.id,
            step - self.base,
            self.rank,
            self.world,
            request,
            max_ahead=max_ahead,
            base_step=self.base,
        )

    def wait_applied(self, step: int, refresh: bool = False) -> None:
        """Block until ``step`` is applied on every shard (at most ``--barrier-timeout``).
        ``refresh``: ask the shards even when ``step`` is known to be applied, to learn how
        far they are (a read's staleness)."""
        if step < self.base and not refresh:
            return
        if self.committed >= step and not refresh:
            return
        step = max(step, self.base - 1)
        t0 = time.perf_counter()
        reached = self.client.wait_committed(self.id, step - self.base, self.barrier_timeout_s)
        self.waits.add(time.perf_counter() - t0)
        with self._lock:
            self._committed = max(self._committed, self.base + reached)

    def applied(self, step: int) -> None:
        """``step`` is known to be applied on every shard (a reply that proved it)."""
        with self._lock:
            self._committed = max(self._committed, step)

    def close(self) -> None:
        self.client.close_session(self.id, self.rank)


class Handoff(Protocol):
    def send(self, step: int, keys: np.ndarray, grads: np.ndarray) -> None: ...

    def send_tables(self, step: int, parts: TableGrads) -> None: ...

    def collect(self, step: int) -> None:
        """Wait for the acknowledgements of a hand-off of ``step`` or earlier still in flight
        (they carry its errors)."""
        ...


class PipelinedHandoff:
    """``staleness`` K: step t's chunks go out once commit t-1-K is applied, so a shard sees
    at most K+1 steps beyond its committed one (K=0: the synchronous rule)."""

    def __init__(self, session: CommitSession, rpc_timeout_s: float, staleness: int = 0) -> None:
        self.session, self.rpc_timeout_s, self.staleness = session, rpc_timeout_s, staleness
        self._lock = threading.Lock()
        self._pending: tuple[int, Handle] | None = None

    def send(self, step: int, keys: np.ndarray, grads: np.ndarray) -> None:
        self._send(
            step, lambda max_ahead: self.session.send(step, keys, grads, max_ahead=max_ahead)
        )

    def send_tables(self, step: int, parts: TableGrads) -> None:
        self._send(
            step, lambda max_ahead: self.session.send_tables(step, parts, max_ahead=max_ahead)
        )

    def _send(self, step: int, start: Callable[[int], Handle]) -> None:
        """``start(max_ahead)`` sends step ``step``'s chunks (one table or all of them)."""
        self.collect(step - 1)  # each hand-off waits for its predecessor's acks
        # ...and for commit t-1-K: a shard holds at most K+1 steps beyond its committed one
        # and refuses the rest, and a worker whose reads waited for no commit (cache hits)
        # could otherwise overtake another worker's late chunk.  Its reads already waited for
        # that commit (or its rows did not depend on it), so this almost never blocks.
        self.session.wait_applied(step - 1 - self.staleness)
        handle = start(self.staleness + 1)
        with self._lock:
            self._pending = (step, handle)

    def collect(self, step: int) -> None:
        with self._lock:
            pending = self._pending
        if pending is None or pending[0] > step:
            return
        t0 = time.perf_counter()
        pending[1].wait(self.rpc_timeout_s)
        self.session.waits.add(time.perf_counter() - t0)
        with self._lock:
            if self._pending is pending:
                self._pending = None

    @property
    def in_flight(self) -> bool:
        with self._lock:
            return self._pending is not None


class BarrierHandoff(PipelinedHandoff):
    """Every step waits for its own commit before the worker goes on."""

    def _send(self, step: int, start: Callable[[int], Handle]) -> None:
        super()._send(step, start)
        self.collect(step)
        self.session.wait_applied(step)


def make_handoff(
    sync: str, session: CommitSession, rpc_timeout_s: float, staleness: int = 0
) -> PipelinedHandoff:
    if sync == "pipelined":
        return PipelinedHandoff(session, rpc_timeout_s)
    if sync == "barrier":
        return BarrierHandoff(session, rpc_timeout_s)
    if sync == "async":
        return PipelinedHandoff(session, rpc_timeout_s, staleness)
    raise ValueError(f"sparse sync {sync!r}: expected pipelined, barrier or async")


class SparseCommitter:
    """Hands each step's sparse gradients to the PS and answers when a step may be read."""

    def __init__(
        self,
        session: CommitSession,
        aggregation: Aggregation,
        handoff: PipelinedHandoff,
        *,
        background: bool = False,
    ) -> None:
        self.session, self.aggregation, self.handoff = session, aggregation, handoff
        self.exchange_s = 0.0  # id exchange and (collective) row all-reduce, training thread
        self.rows_sent = 0
        # How many of the previous steps' commits each read did not see (async mode).
        self.staleness_seen: list[int] = []
        self._pool = (
            ThreadPoolExecutor(1, thread_name_prefix="sparse-submit") if background else None
        )
        self._tail: Future[None] | None = None
        # The hand-off may wait for its predecessor's acks and, under --sparse-sync barrier,
        # for its own commit: the sum of the two bounds.
        self._drain_timeout_s = handoff.rpc_timeout_s + session.barrier_timeout_s

    @property
    def background(self) -> bool:
        """Whether hand-offs run on their own thread (then only drain and the waits block the
        training thread)."""
        return self._pool is not None

    @property
    def committed(self) -> int:
        return self.session.committed

    def start_at(self, step: int) -> None:
        assert self._tail is None and not self.handoff.in_flight
        self.session.start_at(step)

    def submit(
        self,
        step: int,
        keys: np.ndarray,
        grads: np.ndarray,
        union: np.ndarray | None = None,
        then: Callable[[Outgoing], None] | None = None,
    ) -> Outgoing:
        """Hand ``step``'s gradients of this worker's unique rows to the PS; returns what the
        step sends and writes.  ``union``: see :meth:`Aggregation.reduce`.  ``then(outgoing)``
        runs once the gradients are handed over (on the hand-off thread in background mode)."""
        self.drain()
        t0 = time.perf_counter()
        out = self.aggregation.reduce(keys, grads, union)
        self.exchange_s += time.perf_counter() - t0
        if self._pool is None:
            self._hand_off(step, out, then)
        else:
            self._tail = self._pool.submit(self._hand_off, step, out, then)
        return out

    def _hand_off(self, step: int, out: Outgoing, then: Callable[[Outgoing], None] | None) -> None:
        self.rows_sent += len(out.keys)
        self.handoff.send(step, out.keys, out.grads)
        if then is not None:
            then(out)

    def submit_tables(
        self,
        step: int,
        parts: TableGrads,
        unions: Mapping[str, np.ndarray] | None = None,
        then: Callable[[TableOutgoing], None] | None = None,
    ) -> TableOutgoing:
        """:meth:`submit` of every table of a job's step at once (``{table: (keys, grads)}``,
        the job's tables in their order): one aggregation and one set of chunks for all.
        ``unions`` and ``then`` as :meth:`submit`'s, per table.  A session of the one-table
        form (the default job) submits its one table as :meth:`submit`."""
        if not self.session.table_lrs:
            ((name, (keys, grads)),) = parts.items()
            one = None if then is None else (lambda o: then({name: o}))
            union = None if unions is None else unions[name]
            return {name: self.submit(step, keys, grads, union=union, then=one)}
        self.drain()
        t0 = time.perf_counter()
        out = self.aggregation.reduce_tables(parts, unions)
        self.exchange_s += time.perf_counter() - t0
        if self._pool is None:
            self._hand_off_tables(step, out, then)
        else:
            self._tail = self._pool.submit(self._hand_off_tables, step, out, then)
        return out

    def _hand_off_tables(
        self, step: int, out: TableOutgoing, then: Callable[[TableOutgoing], None] | None
    ) -> None:
        self.rows_sent += sum(len(o.keys) for o in out.values())
        self.handoff.send_tables(step, {n: (o.keys, o.grads) for n, o in out.items()})
        if then is not None:
            then(out)

    def drain(self) -> None:
        """Wait for the background hand-off of the last step (a no-op otherwise).  What it
        raised is raised here, and again by every later call: the protocol's state is then
        unknown."""
        if self._tail is None:
            return
        self._tail.result(timeout=self._drain_timeout_s)
        self._tail = None

    def wait_readable(self, step: int) -> None:
        """Block until every step before ``step`` is applied on every shard."""
        self.drain()
        if self.committed >= step - 1:
            return
        self.handoff.collect(step - 1)
        self.session.wait_applied(step - 1)

    def wait_for_read(self, step: int, record: bool = True) -> None:
        """Block until a read of ``step`` may go ahead: every commit up to step-1-K applied
        (K = the hand-off's staleness; K=0 is :meth:`wait_readable`).  Records (``record``)
        how many of the previous steps' commits the read does not see."""
        k = self.handoff.staleness
        if k == 0:
            self.wait_readable(step)
            if record:
                self.staleness_seen.append(0)
            return
        self.drain()
        if self.committed < step - 1:
            self.handoff.collect(step - 1 - k)
            self.session.wait_applied(step - 1 - k, refresh=record)
        if record:
            self.staleness_seen.append(max(0, step - 1 - self.committed))

    def read_with_commit(self, step: int, pull: Callable[[], _Rows]) -> _Rows:
        """A read of ``step`` whose rows come with commit step-1: ``pull`` blocks until every
        shard applied it and returns the rows (a pull the shards parked until then,
        ``reads.AfterCommit``), so the read needs no wait of its own.  The hand-off's
        acknowledgements are collected first; the pull's wait counts as commit wait."""
        assert self.handoff.staleness == 0, "a read after commit step-1 is the pipelined rule"
        self.drain()
        self.handoff.collect(step - 1)
        t0 = time.perf_counter()
        rows = pull()
        self.session.waits.add(time.perf_counter() - t0)
        self.session.applied(step - 1)
        self.staleness_seen.append(0)
        return rows

    def staler_read(self, step: int, held: int) -> None:
        """The read of ``step`` that :meth:`wait_for_read` just recorded used rows that hold
        commits only up to job step ``held`` (early pulls): its staleness is theirs."""
        stale = max(0, step - 1 - held)
        self.staleness_seen[-1] = max(self.staleness_seen[-1], stale)

    def caught_up_read(self) -> None:
        """A read whose rows hold every earlier step although the shards may not have applied
        them yet: the worker applied what they missed (``cpu_dist.sparse.catch_up``)."""
        self.staleness_seen.append(0)

    def wait_applied(self, step: int) -> None:
        """Block until ``step`` is applied, without touching the hand-off's state: safe from
        any thread (the cache stage's staging pulls wait here)."""
        self.session.wait_applied(step)

    def finish(self, last_step: int) -> None:
        """Wait until ``last_step`` is applied, then close this worker's session."""
        self.drain()
        if last_step >= 0:
            self.wait_readable(last_step + 1)
        self.session.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def metrics(self) -> dict[str, float]:
        seen = self.staleness_seen
        return {
            "commit_wait_s": self.session.waits.seconds,
            "sparse_exchange_s": self.exchange_s,
            "rows_pushed": self.rows_sent,
            "staleness_max": max(seen, default=0),
            "staleness_mean": sum(seen) / len(seen) if seen else 0.0,
        }
