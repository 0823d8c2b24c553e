"""Background loading: a worker's next batches, prepared on a thread while it trains.

:class:`WorkerBatches` asks the dataset for this worker's share of step ``start_step``, then
the next step, and so on (``dataset.worker_batch``: random access by step, so nothing before
``start_step`` is read), and keeps at most ``depth`` of them ready in a queue.  The training
thread's data phase is then only the hand-over.

Contracts:

- **Deterministic.**  A share is a pure function of the step, and the thread hands them over in
  step order: the same seed gives the same batches in the same order as reading them in line.
- **Bounded.**  At most ``depth`` batches wait per thread, plus the one each thread makes.
- **Out of the trainer's way.**  With ``hold=True`` each ``next`` pauses the threads before
  they start another batch, until the trainer calls :meth:`release` (or asks for the next
  batch): the trainer then finishes its data phase (tensors, unique keys) without waiting for
  the GIL that a thread making a batch holds in numpy (the synthetic stream holds it most of
  its few milliseconds per batch); the next batch is made during forward and backward, whose
  torch kernels release the GIL.
- **Parallel where parsing is the cost.**  With ``threads = n`` (default: the dataset's
  ``loader_threads``, else 1) thread i makes steps ``start + i, start + i + n, ...`` and the
  hand-over still goes in step order.  The TSV reader asks for two: parsing is its whole cost.
- **Errors reach the trainer.**  An exception on the thread (a malformed line, a missing file)
  is raised again, the same object with its message, by the ``next`` that would have returned
  that step; the thread ends.
- **Stops cleanly.**  The thread ends by itself after ``stop_step - 1`` or the data's last step;
  :meth:`close` (also on leaving a ``with`` block) ends it earlier and waits for it, so no
  thread is left behind.  It is a daemon thread only so that a process that dies on another
  error is not held up by it.

A thread, not a process: the work is parsing in pyarrow, slicing memory maps and numpy, which
release the GIL for their bulk, and a process would have to copy every batch back.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

from cpu_dist.data.batch import Batch

_POLL_S = 0.05  # how often a blocked put or get looks at the stop flag and the other side
JOIN_TIMEOUT_S = 600.0  # the longest one worker_batch call may still take when closing


class ShareSource(Protocol):
    """What the loader needs from a dataset.  A step after the last one must give None too:
    the loader stops at the first None."""

    def worker_batch(self, step: int, batch_size: int, rank: int, world: int) -> Batch | None: ...


def warm_first_share(
    dataset: ShareSource, step: int, batch_size: int, rank: int, world: int
) -> threading.Thread | None:
    """Read worker ``rank``'s share of ``step`` on a thread of its own, so that a dataset that
    keeps what it decoded (``keeps_decoded``: Parquet's slices) has the first batch's rows
    ready while the worker builds its model and meets its shards; None for the others (a
    read now would be a read twice).  Join it before the loader starts.  An error is left to
    the loader, whose read of the same rows raises it with its message."""
    if not getattr(dataset, "keeps_decoded", False):
        return None

    def read() -> None:
        try:
            dataset.worker_batch(step, batch_size, rank, world)
        except Exception:
            pass

    thread = threading.Thread(target=read, name=f"cpu_dist-data-warm-rank{rank}", daemon=True)
    thread.start()
    return thread


class _End:
    pass


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class WorkerBatches:
    """Iterates ``(step, this worker's Batch)`` from ``start_step`` until the data ends or
    ``stop_step`` (exclusive) is reached, each share prepared ahead on background threads."""

    def __init__(
        self,
        dataset: ShareSource,
        batch_size: int,
        start_step: int,
        rank: int,
        world: int,
        depth: int = 2,
        stop_step: int | None = None,
        threads: int | None = None,
        hold: bool = False,
        prepare: Callable[[Batch], Any] | None = None,
    ) -> None:
        """``prepare``: run on the loader thread on each share; its result for the share that
        ``next`` returned last is :attr:`prepared` (the trainer's unique keys: off its data
        phase)."""
        if batch_size <= 0 or world <= 0 or not 0 <= rank < world or batch_size % world:
            raise ValueError(
                f"bad share: global batch {batch_size}, rank {rank} of {world} workers"
            )
        if threads is None:
            threads = int(getattr(dataset, "loader_threads", 1))
        if start_step < 0 or depth < 1 or threads < 1:
            raise ValueError(
                f"need start_step >= 0, depth >= 1, threads >= 1 "
                f"(got {start_step}, {depth}, {threads})"
            )
        self.dataset, self.batch_size = dataset, batch_size
        self.rank, self.world = rank, world
        self.start_step, self.stop_step = start_step, stop_step
        self._next_step = start_step
        self._stop = threading.Event()
        self._go = threading.Event()  # cleared while the trainer holds the threads
        self._go.set()
        self._hold = hold
        self._prepare = prepare
        self.prepared: Any = None
        self._done = False
        per_thread = max(1, -(-depth // threads))
        self._queues: list[queue.Queue] = [queue.Queue(maxsize=per_thread) for _ in range(threads)]
        self._threads = [
            threading.Thread(
                target=self._produce,
                args=(i, threads),
                name=f"cpu_dist-data-rank{rank}-{i}",
                daemon=True,
            )
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    def _produce(self, index: int, threads: int) -> None:
        out = self._queues[index]
        step = self.start_step + index
        try:
            while self.stop_step is None or step < self.stop_step:
                while not self._go.wait(_POLL_S):
                    if self._stop.is_set():
                        return
                if self._stop.is_set():
                    return
                batch = self.dataset.worker_batch(step, self.batch_size, self.rank, self.world)
                if batch is None:
                    break
                extra = None if self._prepare is None else self._prepare(batch)
                if not self._put(out, (step, batch, extra)):
                    return
                step += threads
            self._put(out, _End())
        except BaseException as e:  # handed to the training thread, which raises it
            self._put(out, _Failure(e))

    def _put(self, out: queue.Queue, item: object) -> bool:
        while not self._stop.is_set():
            try:
                out.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> WorkerBatches:
        return self

    def __next__(self) -> tuple[int, Batch]:
        if self._done:
            raise StopIteration
        self._go.set()  # a trainer that forgot release() still gets its batches
        index = (self._next_step - self.start_step) % len(self._threads)
        source, thread = self._queues[index], self._threads[index]
        while True:
            try:
                item = source.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if self._stop.is_set():
                    self._done = True
                    raise StopIteration from None
                if not thread.is_alive() and source.empty():
                    self._done = True
                    raise RuntimeError("a data loader thread ended without a result") from None
        if isinstance(item, _End):
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.error
        self._next_step += 1
        if self._hold:
            self._go.clear()
        step, batch, self.prepared = item
        return step, batch

    def release(self) -> None:
        """Let the threads make batches again (``hold=True``: after the trainer's data phase)."""
        self._go.set()

    def close(self) -> None:
        """Stop the threads and wait for them (each finishes the batch it is making, if any)."""
        self._done = True
        self._stop.set()
        self._go.set()
        for q in self._queues:  # unblock a put at once
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        for t in self._threads:
            t.join(JOIN_TIMEOUT_S)
            if t.is_alive():
                raise RuntimeError(
                    f"data loader thread {t.name} did not stop within {JOIN_TIMEOUT_S:.0f} s"
                )

    @property
    def alive(self) -> bool:
        """Whether a background thread still runs."""
        return any(t.is_alive() for t in self._threads)

    def __enter__(self) -> WorkerBatches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
