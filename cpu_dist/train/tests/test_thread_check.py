"""Threads said aloud (issue 54 item 6): the start line's per-worker thread notes, and the one
note naming --worker-threads when a worker's threads ran the probe slower than one thread."""

from __future__ import annotations

import torch
from mpi4py import MPI

from cpu_dist.common.threads import SPIN_COUNT, ThreadChoice
from cpu_dist.train import thread_check
from cpu_dist.train.thread_check import ThreadCheck, slow_threads_note, thread_notes

SHARE = ThreadChoice(1, "2 cores on its node for 2 workers", short_spin=True)


def test_workers_that_agree_share_a_line_and_the_ps_ranks_have_theirs():
    notes = thread_notes([("a", SHARE), ("a", SHARE), ("b", ThreadChoice(4, "x"))], 2, 5)
    assert notes == [
        "threads: workers 0-1 on a: 1 torch thread each (2 cores on its node for 2 workers; "
        f"idle ones spin {SPIN_COUNT} times, then sleep)",
        "threads: worker 2 on b: 4 torch threads (x)",
        "threads: PS ranks serve on gRPC's threads (no torch threads); workers beside them "
        "run nice +5",
    ]
    assert thread_notes([("a", SHARE)] * 3 + [("b", SHARE), ("a", SHARE)], 0, 5)[0].startswith(
        "threads: workers 0,1,2,4 on a"
    )
    assert len(thread_notes([("a", SHARE)], 0, 5)) == 1  # external shards: no PS-rank line


def test_only_threads_slower_than_one_are_named_with_the_flag():
    assert slow_threads_note([(2, 1.0, 1.5), (1, 0.0, 0.0)]) is None
    note = slow_threads_note([(2, 1.26, 0.93), (2, 1.0, 1.5), (4, 3.0, 2.0)])
    assert note is not None
    assert note.startswith("workers 0,2: 2 torch threads ran slower than one here")
    assert "1.26 ms with 2, 0.93 ms with one" in note
    assert note.endswith("--worker-threads 1 may train faster")


def test_the_probe_runs_once_at_its_step_and_restores_the_threads(monkeypatch):
    calls: list[int] = []

    def fake_probe(threads: int) -> float:
        calls.append(threads)
        return {2: 2.0, 1: 1.0}[threads]

    monkeypatch.setattr(thread_check, "probe_ms", fake_probe)
    check = ThreadCheck(MPI.COMM_SELF, ThreadChoice(2, "t"), start=10)
    notes = [check.after_step(s) for s in range(10, 20)]
    assert calls == [2, 1]  # once, at the third step of the run
    assert notes[thread_check.PROBE_AFTER_STEPS - 1] is not None
    assert sum(n is not None for n in notes) == 1
    one = ThreadCheck(MPI.COMM_SELF, ThreadChoice(1, "t"), start=0)
    assert [one.after_step(s) for s in range(10)] == [None] * 10  # one thread: no probe
    assert calls == [2, 1]


def test_probe_ms_times_the_matmul_and_puts_the_worker_s_threads_back():
    before = torch.get_num_threads()
    assert thread_check.probe_ms(1) > 0
    assert torch.get_num_threads() == before
