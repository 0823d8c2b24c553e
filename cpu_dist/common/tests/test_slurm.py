"""The srun launch checks, on the environments srun, sbatch and mpirun really produce.

The variable sets below were read from tasks of a real Slurm 22.05 step (``--mpi=pmix`` and
``--mpi=none``), an sbatch batch step and an OpenMPI 4.1 mpirun; the integration test
tests/integration/test_slurm.py runs the same checks under a real srun.
"""

from __future__ import annotations

import pytest

from cpu_dist.common.slurm import check_launch_environment, check_world_size

# A task of `srun --mpi=pmix -n 3` (the variables that matter here).
SRUN_PMIX = {
    "SLURM_JOB_ID": "7",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "1",
    "SLURM_NTASKS": "3",
    "SLURM_STEP_NUM_TASKS": "3",
    "SLURM_MPI_TYPE": "pmix",
    "PMIX_RANK": "1",
    "PMIX_NAMESPACE": "slurm.pmix.7.0",
    "PMIX_SERVER_URI2": "pmix-server.1;tcp4://127.0.0.1:1",
}
# A task of `srun --mpi=none -n 3`: the same step, no PMI/PMIx details at all.
SRUN_NONE = {
    "SLURM_JOB_ID": "7",
    "SLURM_STEP_ID": "1",
    "SLURM_PROCID": "2",
    "SLURM_NTASKS": "3",
    "SLURM_STEP_NUM_TASKS": "3",
}
# The batch script of `sbatch -n 3`: no step id (its own step is the batch step).
BATCH = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "3"}
# A rank of `mpirun -np 2` run from that batch script: inherits the batch variables.
MPIRUN_IN_BATCH = {
    **BATCH,
    "OMPI_COMM_WORLD_SIZE": "2",
    "PMIX_RANK": "0",
    "PMIX_NAMESPACE": "1972502529",
    "OMPI_MCA_orte_hnp_uri": "1.0;tcp://x:1",
}
# A rank of `srun -n 1 mpirun -np 3`: inherits a step of one task.
MPIRUN_IN_STEP = {
    **SRUN_NONE,
    "SLURM_NTASKS": "1",
    "SLURM_STEP_NUM_TASKS": "1",
    "OMPI_COMM_WORLD_SIZE": "3",
    "PMIX_RANK": "0",
    "PMIX_NAMESPACE": "1972502529",
    "OMPI_MCA_orte_hnp_uri": "1.0;tcp://x:1",
}


@pytest.mark.parametrize(
    "env,world",
    [
        ({}, 1),
        ({}, 4),  # no Slurm at all
        (SRUN_PMIX, 3),  # a correct srun launch
        (BATCH, 1),
        (BATCH, 3),  # python run directly in the batch script
        (MPIRUN_IN_BATCH, 2),  # mpirun -np 2 inside an allocation of 3 tasks
        (MPIRUN_IN_STEP, 3),  # mpirun inside a one-task srun step
        ({**SRUN_NONE, "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1"}, 1),  # srun -n 1
    ],
)
def test_consistent_launches_pass(env, world):
    check_launch_environment(env)
    check_world_size(world, env)


def test_singletons_under_srun_are_named_with_the_fix():
    env = {**SRUN_NONE, "SLURM_MPI_TYPE": "pmi2"}
    with pytest.raises(RuntimeError) as info:
        check_world_size(1, env)
    msg = str(info.value)
    assert "world of 1 rank(s)" in msg and "started 3 tasks" in msg and "SLURM_NTASKS=3" in msg
    assert "step 7.1" in msg and "task 2" in msg
    assert "srun --mpi=pmix" in msg and "SLURM_MPI_TYPE=pmi2" in msg


def test_srun_without_pmi_is_caught_before_mpi_init():
    with pytest.raises(RuntimeError) as info:
        check_launch_environment(SRUN_NONE)
    msg = str(info.value)
    assert "task 2 of 3" in msg and "SLURM_NTASKS=3" in msg and "srun --mpi=pmix" in msg


def test_step_task_count_prefers_the_step_variable():
    # SLURM_NTASKS may describe the job when a wrapper re-exports it; the step count decides.
    env = {**SRUN_PMIX, "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "3"}
    check_world_size(3, env)
    with pytest.raises(RuntimeError, match="started 3 tasks"):
        check_world_size(2, env)


def test_falls_back_to_slurm_ntasks():
    env = {k: v for k, v in SRUN_PMIX.items() if k != "SLURM_STEP_NUM_TASKS"}
    check_world_size(3, env)
    with pytest.raises(RuntimeError, match="SLURM_NTASKS=3"):
        check_world_size(1, env)


def test_reads_os_environ_by_default(monkeypatch):
    for name, value in SRUN_NONE.items():
        monkeypatch.setenv(name, value)
    for name in (
        "PMIX_RANK",
        "PMIX_NAMESPACE",
        "PMIX_SERVER_URI2",
        "PMI_FD",
        "PMI_RANK",
        "PMI_SIZE",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_MCA_orte_hnp_uri",
        "PRTE_LAUNCHED",
    ):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError):
        check_launch_environment()
    with pytest.raises(RuntimeError):
        check_world_size(1)
    check_world_size(3)
