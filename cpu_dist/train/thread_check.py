"""Threads said aloud: what each worker's torch threads are and why (the start line), and
once, early in the run, whether they run faster than one thread would on this node.

A worker's default thread count is its share of the node's cores (``common/threads.py``); on a
node whose cores the shard ranks and other jobs also use, those threads can contend for the
same cores and make a step slower than one thread would (a user's one-worker DeepFM: 14-19k
samples/s with the default threads, 27-29k with one).  So each worker times a small matmul
with its threads and with one, at the same moment of the same step (the node as loaded as it
trains), and worker 0 says once which workers' threads lost, naming ``--worker-threads``.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence

import torch
from mpi4py import MPI

from cpu_dist.common.threads import SPIN_COUNT, ThreadChoice

# The probe runs after this many steps of the run (its first ones warm caches and allocators).
PROBE_AFTER_STEPS = 3
# The probe: a [M, K] x [K, K] matmul, the shape of a dense layer's forward on a small batch
# (about 70 MFLOP, a few milliseconds on one core); the fastest of REPEATS.
PROBE_M, PROBE_K, REPEATS = 256, 512, 5


def thread_notes(
    choices: Sequence[tuple[str, ThreadChoice]], ps_ranks: int, worker_nice: int
) -> list[str]:
    """The start line's thread notes: each worker's torch threads and why (workers that agree
    on one line), then the PS ranks'.  ``choices``: (host, choice) per worker rank."""
    groups: dict[tuple[str, ThreadChoice], list[int]] = {}
    for rank, (host, choice) in enumerate(choices):
        groups.setdefault((host, choice), []).append(rank)
    notes = []
    for (host, choice), ranks in groups.items():
        who = f"worker {ranks[0]}" if len(ranks) == 1 else f"workers {_ranks(ranks)}"
        each = " each" if len(ranks) > 1 else ""
        threads = f"{choice.threads} torch thread{'s' * (choice.threads > 1)}{each}"
        spin = f"; idle ones spin {SPIN_COUNT} times, then sleep" if choice.short_spin else ""
        notes.append(f"threads: {who} on {host}: {threads} ({choice.why}{spin})")
    if ps_ranks:
        nice = f"; workers beside them run nice +{worker_nice}" if worker_nice else ""
        notes.append(f"threads: PS ranks serve on gRPC's threads (no torch threads){nice}")
    return notes


def _ranks(ranks: list[int]) -> str:
    """``0-3`` for consecutive ranks, else ``0,2,5``."""
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def probe_ms(threads: int) -> float:
    """The probe matmul's fastest time in ms with ``threads`` torch threads (the worker's
    own count is put back afterwards)."""
    before = torch.get_num_threads()
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(PROBE_M, PROBE_K, generator=gen)
    b = torch.randn(PROBE_K, PROBE_K, generator=gen)
    try:
        torch.set_num_threads(threads)
        torch.mm(a, b)  # warm: the thread pool at this size
        best = float("inf")
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return best * 1e3


def slow_threads_note(timings: Sequence[tuple[int, float, float]]) -> str | None:
    """One line naming the workers whose threads ran the probe slower than one thread did,
    and the flag to set; None when none did.  ``timings``: (threads, ms with them, ms with
    one) per worker rank."""
    slow = [(r, t) for r, t in enumerate(timings) if t[0] > 1 and t[1] > t[2]]
    if not slow:
        return None
    r, (n, many, one) = slow[0]
    who = f"worker {r}" if len(slow) == 1 else f"workers {_ranks([r for r, _ in slow])}"
    return (
        f"{who}: {n} torch threads ran slower than one here (a {PROBE_M}x{PROBE_K} matmul: "
        f"{many:.2f} ms with {n}, {one:.2f} ms with one; the node's cores are busy with its "
        f"other ranks): --worker-threads 1 may train faster"
    )


class ThreadCheck:
    """Each worker's threads, known to every worker (one allgather at start), and the probe,
    run by every worker at the same step when any worker has more than one thread."""

    def __init__(self, comm: MPI.Intracomm, choice: ThreadChoice, start: int) -> None:
        self.comm = comm
        self.choices: list[tuple[str, ThreadChoice]] = comm.allgather(
            (socket.gethostname(), choice)
        )
        self.threads = choice.threads
        wanted = any(c.threads > 1 for _, c in self.choices)
        self.probe_step = start + PROBE_AFTER_STEPS - 1 if wanted else None

    def after_step(self, step: int) -> str | None:
        """At the probe's step (collective over the workers): the slow-threads note, if any;
        None at every other step."""
        if step != self.probe_step:
            return None
        mine = (self.threads, probe_ms(self.threads), probe_ms(1)) if self.threads > 1 else None
        timings = [t if t is not None else (1, 0.0, 0.0) for t in self.comm.allgather(mine)]
        return slow_threads_note(timings)
