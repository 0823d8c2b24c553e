"""How many intra-op threads each worker's PyTorch may use, and how its idle ones wait.

mpirun binds nothing here (scripts/env.sh), so every rank sees all of the node's cores; left
alone, each worker's torch would start one thread per core and W workers would oversubscribe
the node W times.  Each worker takes an equal share of the cores it may run on instead, so a
single worker uses the whole node.  OMP_NUM_THREADS, when set (Slurm's cpus-per-task, a
user), wins over the share, and ``--worker-threads`` over both.  The start line says each
worker's count and why (``train/thread_check.py``), and a job whose workers' threads run no
faster than one thread says so once, with the flag to set.

A worker that shares its node with other ranks (a PS shard, other workers) also has torch's
idle OpenMP threads spin only briefly before they sleep (``GOMP_SPINCOUNT``): libgomp's default
keeps a thread that finished its share of a parallel region spinning for a while, and on shared
cores that time is taken from the shard; a thread that sleeps at once (``OMP_WAIT_POLICY=
PASSIVE``) makes every parallel region wake it, which doubled a multi-hot model's forward and
backward (measured in ``share_cores``).  OMP_WAIT_POLICY or GOMP_SPINCOUNT, when set, wins.

A worker that shares its node with a PS rank runs nicer than it (``--worker-nice``, 5): the
shard's work is short and latency-bound (a commit's apply, a read's gather: every worker waits
on it), the workers' is long and throughput-bound (forward, backward, and MPI waits that spin
and yield).  At equal priority a shard thread that wakes queues behind two busy workers.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from mpi4py import MPI

# libgomp's spins of an idle thread before it sleeps, on a shared node (its default: 300k).
SPIN_COUNT = "10000"


@dataclass(frozen=True)
class NodeShare:
    """This job's ranks on one node, and how many of them are workers."""

    ranks: int
    workers: int


def node_share(world: MPI.Intracomm, is_worker: bool) -> NodeShare:
    """Collective over ``world``: who shares this rank's node."""
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return NodeShare(node.Get_size(), int(node.allreduce(int(is_worker))))
    finally:
        node.Free()


@dataclass(frozen=True)
class ThreadChoice:
    """A worker's torch thread count and why (the start line says both, per worker)."""

    threads: int
    why: str
    # Idle OpenMP threads spin only SPIN_COUNT times before they sleep (a shared node).
    short_spin: bool = False


def choose_threads(
    node: NodeShare, requested: int, env: dict[str, str], cores: int
) -> ThreadChoice:
    """The thread count: ``--worker-threads`` when given (``requested`` > 0), else
    OMP_NUM_THREADS (Slurm's cpus-per-task, a user's), else an equal share of the ``cores``
    this process may run on among the node's workers.  Pure: the start line's words."""
    if requested > 0:
        return ThreadChoice(requested, f"--worker-threads {requested}")
    if env.get("OMP_NUM_THREADS"):
        return ThreadChoice(
            int(env["OMP_NUM_THREADS"]), f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}"
        )
    workers = max(node.workers, 1)
    n = max(1, cores // workers)
    return ThreadChoice(n, f"{cores} cores on its node for {workers} worker{'s' * (workers > 1)}")


def share_cores(node: NodeShare, requested: int = 0) -> ThreadChoice:
    """Before this process first imports torch (libgomp reads its wait policy when it loads):
    torch's thread count (:func:`choose_threads`) and, on a shared node, a short spin
    (``SPIN_COUNT``) before an idle thread sleeps.  In ``bench_models.py``'s one-worker job
    (worker and shard on two cores), alternating runs of 100 steps: libgomp's default spin
    9.4-9.6k samples/s, the passive wait 9.0k, the short spin 10.7-10.8k (its forward and
    backward 66 ms a step against 83 passive); a row-wise Adagrad one-worker job 21.2-21.3k
    passive against 22.1-22.9k."""
    short_spin = False
    if node.ranks > 1 and "torch" not in sys.modules:
        if "OMP_WAIT_POLICY" not in os.environ:
            short_spin = os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT) == SPIN_COUNT
    choice = choose_threads(node, requested, dict(os.environ), len(os.sched_getaffinity(0)))
    import torch  # here: PS ranks, which never compute, do not pay its import

    torch.set_num_threads(choice.threads)
    return ThreadChoice(choice.threads, choice.why, short_spin)


def yield_to_shards(node: NodeShare, nice: int) -> int:
    """Lowers this worker's CPU priority by ``nice`` when a PS rank shares its node (the rank
    count exceeds the workers'); returns the increment applied (0: none).  Call it before the
    process starts its threads: Linux keeps a nice value per thread, and new threads inherit
    their creator's.  Unprivileged processes may always lower their priority, never raise it
    back, so this is one-way.  W=2 default job (``bench_train.py``'s shape, 150 steps, workers
    reniced 4 s in): commit wait 3.3 -> 1.3-1.4 ms a step, exposed sparse 10.8 -> 9.4 ms."""
    if nice <= 0 or node.ranks <= node.workers:
        return 0
    os.nice(nice)
    return nice
