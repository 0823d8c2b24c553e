"""How many intra-op threads each worker's PyTorch may use.

mpirun binds nothing here (scripts/env.sh), so every rank sees all of the node's cores; left
alone, each worker's torch would start one thread per core and W workers would oversubscribe
the node W times.  Each worker takes an equal share of the cores it may run on instead, so a
single worker uses the whole node.  OMP_NUM_THREADS, when set (Slurm's cpus-per-task, a
user), wins.
"""

from __future__ import annotations

import os

from mpi4py import MPI


def workers_on_this_node(world: MPI.Intracomm, is_worker: bool) -> int:
    """Collective over ``world``: how many worker ranks share this rank's node."""
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return int(node.allreduce(int(is_worker)))
    finally:
        node.Free()


def share_cores(local_workers: int) -> int:
    if os.environ.get("OMP_NUM_THREADS"):
        n = int(os.environ["OMP_NUM_THREADS"])
    else:
        n = max(1, len(os.sched_getaffinity(0)) // max(local_workers, 1))
    import torch  # here: PS ranks, which never compute, do not pay its import

    torch.set_num_threads(n)
    return n
