"""A worker's torch threads: its share of the node's cores, and a passive OpenMP wait where
other ranks share the node (libgomp reads the policy when torch first loads it, so each case
runs in a fresh interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHECK = """
import os, sys
from cpu_dist.common.threads import NodeShare, share_cores
n = share_cores(NodeShare(ranks={ranks}, workers={workers}))
import torch
print(os.environ.get("OMP_WAIT_POLICY"), n, torch.get_num_threads())
"""


def run(ranks: int, workers: int, **env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    out = subprocess.run(
        [sys.executable, "-c", CHECK.format(ranks=ranks, workers=workers)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.split()


@pytest.mark.parametrize("ranks, policy", [(1, "None"), (2, "PASSIVE")])
def test_the_idle_threads_sleep_only_on_a_shared_node(ranks, policy):
    assert run(ranks, 1, OMP_NUM_THREADS="2") == [policy, "2", "2"]


def test_a_policy_given_wins():
    assert run(2, 1, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="ACTIVE")[0] == "ACTIVE"


def test_workers_share_the_cores():
    cores = len(os.sched_getaffinity(0))
    expected = str(max(1, cores // 2))
    assert run(3, 2)[1:] == [expected, expected]
