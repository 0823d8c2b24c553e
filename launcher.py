#!/usr/bin/env python
"""Start a cpu_dist job: ``mpirun -np N python launcher.py --worker-num W [flags]``.

Ranks 0..W-1 train (PyTorch, dense gradients over MPI); the other ranks are parameter-server
shards (C++, sparse rows over gRPC).  ``python launcher.py --help`` lists every flag.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from cpu_dist.common.flags import parse_args
    from cpu_dist.common.validate import ConfigError, validate

    args = parse_args(argv)
    from cpu_dist.common.slurm import check_launch_environment

    try:
        check_launch_environment()  # without PMIx, OpenMPI would abort inside MPI_Init
    except RuntimeError as exc:
        # Every task says it (each names its task number): srun ends the step's other tasks
        # as soon as one exits, so a message left to task 0 was lost when another task, on a
        # loaded node, exited before task 0 had printed.
        print(f"launcher.py: error: {exc}", file=sys.stderr, flush=True)
        return 2
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    try:
        from cpu_dist.common.slurm import check_world_size

        check_world_size(world.Get_size())
        cfg = validate(args, world.Get_size())
    except (ConfigError, RuntimeError) as exc:
        # Every rank reaches the same verdict from the same argv; rank 0 speaks for all.
        if world.Get_rank() == 0:
            print(f"launcher.py: error: {exc}", file=sys.stderr, flush=True)
        return 2

    from cpu_dist.common.mpi_context import run_or_abort, split_roles
    from cpu_dist.train.job import is_expected_error, run_job

    roles = split_roles(cfg.job.worker_num, world)
    code = run_or_abort(lambda: run_job(cfg, roles), lambda: roles.name, is_expected_error)
    from cpu_dist.common.process_exit import skip_exit_collection

    skip_exit_collection()  # the job has closed its shards, clients and files
    return code


if __name__ == "__main__":
    sys.exit(main())
