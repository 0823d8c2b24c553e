#!/usr/bin/env python
"""Start a cpu_dist job: ``mpirun -np N python launcher.py --worker-num W [flags]``.

Ranks 0..W-1 train (PyTorch, dense gradients over MPI); the other ranks are parameter-server
shards (C++, sparse rows over gRPC).  ``python launcher.py --help`` lists every flag.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from cpu_dist.common.flags import parse_args
    from cpu_dist.common.validate import ConfigError, validate

    args = parse_args(argv)
    problem = _model_problem(args)
    if problem is not None:
        return _refuse_before_mpi(problem)
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


def _model_problem(args: argparse.Namespace) -> str | None:
    """A user model whose file or package does not exist, named as the user gave it
    (``--model``, or the job file's ``[model] name``); None when it may exist."""
    from cpu_dist.common.config import model_source_problem

    problem = model_source_problem(args.model)
    if problem is None:
        return None
    job_file = args.job_file
    if "model" not in args.given and job_file is not None and job_file.model_name is not None:
        return f"{job_file.path}: [model] name {args.model!r}: {problem}"
    return f"--model {args.model!r}: {problem}"


# How long a rank other than the first waits before it exits 2 on a verdict every rank reached
# before MPI started: mpirun (and srun --kill-on-bad-exit) ends the job at the first non-zero
# exit, which must not come before the first rank has printed the one message.  The first
# rank's exit ends the wait (mpirun then stops the rest); the bound covers a launcher that
# lets every task run to its end.
REFUSAL_GRACE_S = 5.0


def _refuse_before_mpi(message: str) -> int:
    """One ``launcher.py: error:`` line from the first rank (its rank read from the launcher's
    environment), exit 2 on every rank."""
    from cpu_dist.common.first_rank import launch_rank

    if launch_rank() == 0:
        print(f"launcher.py: error: {message}", file=sys.stderr, flush=True)
    else:
        time.sleep(REFUSAL_GRACE_S)
    return 2


if __name__ == "__main__":
    sys.exit(main())
