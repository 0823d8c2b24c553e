"""Catch an srun launch whose tasks cannot form one MPI job, and say what to fix.

Under ``srun`` the tasks of a step find each other only through a process-management server
that srun starts when asked (``--mpi=pmix``; Debian's OpenMPI has PMIx support only). Without
it, nothing ties the tasks together: depending on the MPI library each task either aborts
inside ``MPI_Init`` with a misleading "OMPI was not built with SLURM's PMI support" (OpenMPI
4.1), or comes up as a singleton that believes it is rank 0 of 1 and trains alone. Two checks,
one on each side of ``MPI_Init``, turn both into one actionable message:

- :func:`check_launch_environment` before MPI is initialised (before ``from mpi4py import
  MPI``): a multi-task srun step that carries no PMI/PMIx connection details.
- :func:`check_world_size` right after: a world size that differs from the step's task count.

Both do nothing outside an srun step (plain ``mpirun``, an ``sbatch`` script's own batch step,
``mpirun`` inside an allocation), so the framework needs no other Slurm-specific code.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["check_launch_environment", "check_world_size", "slurm_job"]

# Variables through which a launcher hands a task its PMI/PMIx server (Slurm's pmix and pmi2
# plugins, OpenMPI's mpirun, MPICH's hydra). Any of them means "a launcher wired this task up".
_PMI_VARS = (
    "PMIX_NAMESPACE",
    "PMIX_RANK",
    "PMIX_SERVER_URI2",
    "PMI_FD",
    "PMI_RANK",
    "PMI_SIZE",
    "OMPI_COMM_WORLD_SIZE",
)

# Slurm's PMIx plugin names a step's namespace "slurm.pmix.<job>.<step>".
_SLURM_PMIX_PREFIX = "slurm.pmix."


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _step_tasks(env: Mapping[str, str]) -> int | None:
    """Tasks srun started in this step, or None outside an srun step.

    ``SLURM_STEP_ID`` marks a task of an srun step; an sbatch script's own (batch) step has
    none, so ``mpirun`` run from a batch script is never mistaken for an srun launch.
    """
    if "SLURM_STEP_ID" not in env:
        return None
    for name in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def _launched_by_other_launcher(env: Mapping[str, str]) -> bool:
    """True when an MPI launcher other than srun started this process (e.g. ``srun -n1 mpirun``).

    Its ranks inherit the srun step's variables, whose task count then says nothing about
    the MPI world.
    """
    if "OMPI_MCA_orte_hnp_uri" in env or "PRTE_LAUNCHED" in env:
        return True
    namespace = env.get("PMIX_NAMESPACE")
    return namespace is not None and not namespace.startswith(_SLURM_PMIX_PREFIX)


def _fix_hint(env: Mapping[str, str]) -> str:
    mpi_type = env.get("SLURM_MPI_TYPE")
    seen = f" (this step ran with SLURM_MPI_TYPE={mpi_type})" if mpi_type else ""
    return (
        "srun did not connect the tasks to a PMIx server" + seen + ". Launch with "
        "`srun --mpi=pmix ...` (scripts/slurm/train.sbatch does; do not export "
        "SLURM_MPI_TYPE=none or pmi2), or ask the admins for MpiDefault=pmix in slurm.conf. "
        "`srun --mpi=list` must list pmix; Debian's OpenMPI supports only PMIx under srun "
        "(pmi2 fails). Alternatively start the job with mpirun inside the allocation."
    )


def check_launch_environment(environ: Mapping[str, str] | None = None) -> None:
    """Raise RuntimeError if this is one task of a multi-task srun step without PMI/PMIx.

    Call it before MPI is initialised: OpenMPI aborts inside ``MPI_Init`` in this case, with
    a message that blames the build instead of the srun flag.
    """
    env = _env(environ)
    tasks = _step_tasks(env)
    if tasks is None or tasks <= 1:
        return
    if any(name in env for name in _PMI_VARS):
        return
    procid = env.get("SLURM_PROCID", "?")
    raise RuntimeError(
        f"this is task {procid} of {tasks} in Slurm step {env.get('SLURM_JOB_ID', '?')}."
        f"{env.get('SLURM_STEP_ID', '?')} (SLURM_NTASKS={tasks}), but no PMI/PMIx server "
        f"details reached it, so the {tasks} tasks would start as {tasks} separate one-rank "
        f"MPI jobs instead of one job: {_fix_hint(env)}"
    )


def check_world_size(world_size: int, environ: Mapping[str, str] | None = None) -> None:
    """Raise RuntimeError if srun started a different number of tasks than MPI sees.

    Call it right after MPI is initialised, with ``COMM_WORLD``'s size. A mismatch (usually
    every task being "rank 0 of 1") means the tasks came up as singletons.
    """
    env = _env(environ)
    tasks = _step_tasks(env)
    if tasks is None or tasks == world_size or _launched_by_other_launcher(env):
        return
    raise RuntimeError(
        f"MPI sees a world of {world_size} rank(s) but Slurm started {tasks} tasks in step "
        f"{env.get('SLURM_JOB_ID', '?')}.{env.get('SLURM_STEP_ID', '?')} "
        f"(SLURM_NTASKS={tasks}, this is task {env.get('SLURM_PROCID', '?')}): the tasks came "
        f"up as separate MPI jobs, not as one. {_fix_hint(env)}"
    )


def slurm_job(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``) of this process, "" where unset.

    A checkpoint directory's owner record keeps them (``cpu_dist.checkpoint.owner``): a
    requeued job keeps its job id (and counts one more restart), so a ``--resume`` of the same
    Slurm job may take over the directory its earlier, preempted run still appears to hold.
    """
    env = _env(environ)
    return env.get("SLURM_JOB_ID", "").strip(), env.get("SLURM_RESTART_COUNT", "").strip()
