"""A worker's torch threads: its share of the node's cores, and a short OpenMP spin where other
ranks share the node (libgomp reads its settings when torch first loads it, so each case runs
in a fresh interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cpu_dist.common.threads import SPIN_COUNT, NodeShare, ThreadChoice, choose_threads

CHECK = """
import os, sys
from cpu_dist.common.threads import NodeShare, share_cores
n = share_cores(NodeShare(ranks={ranks}, workers={workers})).threads
import torch
print(os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT"), n,
      torch.get_num_threads())
"""


def run(ranks: int, workers: int, **env: str) -> list[str]:
    mine = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")
    base = {k: v for k, v in os.environ.items() if k not in mine}
    out = subprocess.run(
        [sys.executable, "-c", CHECK.format(ranks=ranks, workers=workers)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.split()


@pytest.mark.parametrize("ranks, spin", [(1, "None"), (2, SPIN_COUNT)])
def test_the_idle_threads_spin_briefly_only_on_a_shared_node(ranks, spin):
    assert run(ranks, 1, OMP_NUM_THREADS="2") == ["None", spin, "2", "2"]


def test_a_policy_or_spin_given_wins():
    assert run(2, 1, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="ACTIVE")[:2] == ["ACTIVE", "None"]
    assert run(2, 1, OMP_NUM_THREADS="1", GOMP_SPINCOUNT="7")[:2] == ["None", "7"]


def test_workers_share_the_cores():
    cores = len(os.sched_getaffinity(0))
    expected = str(max(1, cores // 2))
    assert run(3, 2)[2:] == [expected, expected]


def test_the_flag_wins_over_the_environment_which_wins_over_the_share():
    node = NodeShare(ranks=3, workers=2)
    env = {"OMP_NUM_THREADS": "3"}
    assert choose_threads(node, 1, env, 8) == ThreadChoice(1, "--worker-threads 1")
    assert choose_threads(node, 0, env, 8) == ThreadChoice(3, "OMP_NUM_THREADS=3")
    assert choose_threads(node, 0, {}, 8) == ThreadChoice(4, "8 cores on its node for 2 workers")
    alone = choose_threads(NodeShare(ranks=2, workers=1), 0, {}, 1)
    assert alone == ThreadChoice(1, "1 cores on its node for 1 worker")


NICE = """
import os, threading
from cpu_dist.common.threads import NodeShare, yield_to_shards
before = os.getpriority(os.PRIO_PROCESS, 0)
applied = yield_to_shards(NodeShare(ranks={ranks}, workers={workers}), {nice})
seen = []
t = threading.Thread(target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, 0)))
t.start(); t.join()
print(before, applied, os.getpriority(os.PRIO_PROCESS, 0) - before, seen[0] - before)
"""


@pytest.mark.parametrize(
    "ranks, workers, nice, expected",
    [(3, 2, 5, 5), (2, 1, 3, 3), (2, 2, 5, 0), (1, 1, 5, 0), (3, 2, 0, 0)],
)
def test_a_worker_beside_a_ps_rank_runs_nicer_and_so_do_its_threads(ranks, workers, nice, expected):
    """Only where a PS rank shares the node (more ranks than workers), by the increment asked;
    threads started afterwards inherit it (Linux keeps nice per thread)."""
    out = subprocess.run(
        [sys.executable, "-c", NICE.format(ranks=ranks, workers=workers, nice=nice)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    before, applied, moved, moved_thread = map(int, out.stdout.split())
    assert applied == expected
    assert moved == moved_thread == min(expected, 19 - before)  # nice stops at 19
