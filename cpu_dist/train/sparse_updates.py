"""How a step's sparse gradients reach the parameter server, and when a pull may read them.

Two aggregation modes (``--aggregation``):
  ps          every worker commits the gradients of its own unique rows; each shard sums all
              workers' chunks in rank order, divides by W and runs the optimizer once per row.
  collective  workers all-reduce the gradients of the union of their rows over MPI; each row is
              then committed by one designated worker (every worker still sends its markers),
              and the shard divides by W as before.
Two sync modes (``--sparse-sync``):
  barrier     commit step t and wait until it is applied before doing anything else.
  pipelined   commit step t asynchronously; the dense all-reduce, optimizer step and the next
              batch's preparation overlap it; the pull of step t+1 waits for commit t.
Either way step t+1 reads rows that hold every worker's step-t update (DESIGN.md section 3).

``background=True`` (the cache stage, which keeps its rows coherent itself and so does not
wait for commit t before reading step t+1) hands step t to the PS, and runs the caller's
follow-up (the cache's coherence), on a thread of its own while the training thread goes on
with the dense all-reduce.  The collective exchange stays on the training thread: two threads
in MPI collectives at once on a node whose cores are all busy made both slower.  Every method
that reads the protocol's state first drains that thread (with a timeout).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
from mpi4py import MPI

from cpu_dist.common.mpi_context import allgather_keys
from cpu_dist.data.keys import find_sorted
from cpu_dist.sparse import Client, Handle


class SparseUpdater:
    def __init__(
        self,
        client: Client,
        comm: MPI.Intracomm,
        session: int,
        *,
        lr: float,
        optimizer: str,
        aggregation: str = "ps",
        sync: str = "pipelined",
        timeout_s: float = 60.0,
        track_written: bool = False,
        background: bool = False,
    ) -> None:
        if aggregation not in ("ps", "collective"):
            raise ValueError(f"aggregation {aggregation!r}: expected ps or collective")
        if sync not in ("pipelined", "barrier"):
            raise ValueError(f"sync {sync!r}: expected pipelined or barrier")
        self.client, self.comm, self.session = client, comm, session
        self.rank, self.world = comm.Get_rank(), comm.Get_size()
        self.lr, self.optimizer = lr, optimizer
        self.aggregation, self.sync, self.timeout_s = aggregation, sync, timeout_s
        self.pending: tuple[int, Handle] | None = None
        self.committed = -1
        # The PS session counts steps from 0; a resumed job's first step is `base`.
        self.base = 0
        self.commit_wait_s = 0.0  # time blocked on commits (acks and application)
        self.exchange_s = 0.0  # collective mode: id exchange and gradient all-reduce
        self.payload_bytes = 0  # gradient bytes this worker sent to the PS
        self.rows_sent = 0
        # Sorted keys every worker wrote in the last submitted step (track_written): the rows
        # a pull of the next step must wait for; all others may be read before that commit.
        self.track_written = track_written
        self.written: np.ndarray | None = None
        # background: the hand-off thread and the step it is running
        self._pool = (
            ThreadPoolExecutor(1, thread_name_prefix="sparse-submit") if background else None
        )
        self._tail: Future | None = None

    # -- submit -----------------------------------------------------------------------
    def submit(
        self,
        step: int,
        keys: np.ndarray,
        grads: np.ndarray,
        union: np.ndarray | None = None,
        then: Callable[[], None] | None = None,
    ) -> None:
        """Hand step ``step``'s gradients of this worker's unique rows to the PS.

        ``union``: the sorted union of every worker's keys of this step when the caller already
        knows it (the cache stage's plans); collective aggregation then skips its id exchange.
        Every worker must pass the same union, or none.  ``then`` runs once the gradients are
        handed over (on the submit thread in background mode)."""
        self.drain()  # a no-op without a hand-off thread
        if self.aggregation == "collective":
            t0 = time.perf_counter()
            keys, grads = self._allreduce_rows(keys, grads, union)
            self.written = self.last_reduced[0]
            self.exchange_s += time.perf_counter() - t0
        elif self.track_written:
            t0 = time.perf_counter()
            self.written = self._gather_keys(keys)
            self.exchange_s += time.perf_counter() - t0
        if self._pool is None:
            self._hand_off(step, keys, grads, then)
        else:
            self._tail = self._pool.submit(self._hand_off, step, keys, grads, then)

    @property
    def background(self) -> bool:
        """Whether commit waits happen on the hand-off thread (then only ``drain`` and
        ``wait_readable`` block the training thread)."""
        return self._pool is not None

    def drain(self) -> None:
        """Wait for the background submit of the last step (a no-op otherwise).  What it raised
        is raised here, and again by every later call: the protocol's state is then unknown.
        The hand-off may wait for the previous step's acks and, with ``--sparse-sync
        barrier``, for its own commit: each up to ``timeout_s``."""
        if self._tail is None:
            return
        self._tail.result(timeout=2 * self.timeout_s + 5.0)
        self._tail = None

    def _hand_off(
        self, step: int, keys: np.ndarray, grads: np.ndarray, then: Callable[[], None] | None
    ) -> None:
        self._wait_handle()  # each sparse update waits for its predecessor's acks
        self.payload_bytes += keys.nbytes + grads.nbytes
        self.rows_sent += len(keys)
        args = (
            self.session,
            step - self.base,
            self.rank,
            self.world,
            keys,
            grads,
            self.lr,
            self.optimizer,
        )
        if self.sync == "barrier":
            t0 = time.perf_counter()
            self.client.commit(*args)
            self.committed = self.base + self.client.wait_committed(
                self.session, step - self.base, self.timeout_s
            )
            self.commit_wait_s += time.perf_counter() - t0
        else:
            self.pending = (step, self.client.commit_async(*args))
        if then is not None:
            then()

    def _gather_keys(self, keys: np.ndarray) -> np.ndarray:
        """The sorted union of every worker's keys (the step's id metadata exchange)."""
        return np.unique(allgather_keys(self.comm, keys))

    def _allreduce_rows(
        self, keys: np.ndarray, grads: np.ndarray, union: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        if union is None:
            union = self._gather_keys(keys)
        at, found = find_sorted(union, keys)
        if not found.all():
            raise ValueError(
                f"rank {self.rank}: the step's key union does not hold every key of this worker"
            )
        summed = np.zeros((len(union), grads.shape[1]), dtype=np.float32)
        summed[at] = grads
        self.comm.Allreduce(MPI.IN_PLACE, summed, op=MPI.SUM)
        # The designated submitter of a row: a function of the key every worker computes alike.
        mine = (union % self.world) == self.rank
        self.last_reduced = (union, summed)  # every row's full sum: the cache stage reads it
        return union[mine], summed[mine]

    def start_at(self, step: int) -> None:
        """A resumed job: ``step`` is the first step this session commits (its step 0), and
        everything before it is already in the restored rows."""
        assert self.pending is None and self._tail is None and self.committed == self.base - 1
        self.base, self.committed = step, step - 1

    # -- wait -------------------------------------------------------------------------
    def _wait_handle(self) -> None:
        if self.pending is None:
            return
        t0 = time.perf_counter()
        step, handle = self.pending
        handle.wait(self.timeout_s)
        self.pending = None
        self.commit_wait_s += time.perf_counter() - t0
        self._pending_step = step

    def wait_readable(self, step: int) -> None:
        """Block until every step before ``step`` is applied on every shard."""
        self.drain()
        if self.committed >= step - 1:
            return
        self._wait_handle()
        t0 = time.perf_counter()
        self.committed = self.base + self.client.wait_committed(
            self.session, step - 1 - self.base, self.timeout_s
        )
        self.commit_wait_s += time.perf_counter() - t0

    def wait_applied(self, step: int) -> None:
        """Block until ``step`` is applied on every shard, without touching this object's
        state (the cache stage's background thread calls it beside the training thread)."""
        if step >= self.base:
            self.client.wait_committed(self.session, step - self.base, self.timeout_s)

    def finish(self, last_step: int) -> None:
        """Drain: wait until ``last_step`` is applied, then close this worker's session."""
        self.drain()  # also when there is no step to wait for
        if last_step >= 0:
            self.wait_readable(last_step + 1)
        self.client.close_session(self.session, self.rank)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
