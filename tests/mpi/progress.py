"""Ordering events between ranks in a test without sleeps: ranks report how far they got, and
one rank (the watcher) waits, with a timeout, until the others have reached a step.

A test that wants "the other workers ran ahead of this one" makes the slow worker wait here
for it, instead of slowing that worker with a sleep and hoping the others used the time.
"""

from __future__ import annotations

import time

from mpi4py import MPI

TAG = 7301  # on a communicator of its own (a Dup), so no other traffic can match it
POLL_S = 0.001  # between probes while waiting: a blocked Recv would spin a core


class Progress:
    """Collective over ``comm`` (construct and ``close`` on every rank of it)."""

    def __init__(self, comm: MPI.Comm, watcher: int, timeout_s: float) -> None:
        self.comm = comm.Dup()
        self.rank, self.watcher, self.timeout_s = self.comm.Get_rank(), watcher, timeout_s
        self.others = [r for r in range(self.comm.Get_size()) if r != watcher]
        self.seen = dict.fromkeys(self.others, -1)  # on the watcher: the step each reported
        self._sent: list[MPI.Request] = []

    def reached(self, step: int) -> None:
        """This rank (not the watcher) got to ``step``."""
        assert self.rank != self.watcher
        self._sent.append(self.comm.isend(step, dest=self.watcher, tag=TAG))

    def wait_for_others(self, step: int) -> dict[int, int]:
        """On the watcher: block until every other rank reported ``step`` or later; returns
        what each reported.  Raises TimeoutError naming the ranks still behind."""
        assert self.rank == self.watcher
        deadline = time.monotonic() + self.timeout_s
        status = MPI.Status()
        while min(self.seen.values(), default=step) < step:
            if self.comm.iprobe(source=MPI.ANY_SOURCE, tag=TAG, status=status):
                src = status.Get_source()
                self.seen[src] = max(self.seen[src], self.comm.recv(source=src, tag=TAG))
            elif time.monotonic() > deadline:
                behind = {r: s for r, s in self.seen.items() if s < step}
                raise TimeoutError(
                    f"rank {self.watcher} waited {self.timeout_s} s for the other ranks to "
                    f"reach step {step}; still behind (rank: step reached): {behind}"
                )
            else:
                time.sleep(POLL_S)
        return dict(self.seen)

    def close(self) -> None:
        """Every report delivered (the watcher must have waited for the last ones), then the
        communicator freed."""
        deadline = time.monotonic() + self.timeout_s
        while not MPI.Request.Testall(self._sent):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {self.rank}: progress reports not received")
            time.sleep(POLL_S)
        self.comm.Free()
