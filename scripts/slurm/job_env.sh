# Sourced by train.sbatch and test.sbatch once they know ROOT (the project root): the Python
# to run, the project's MPI environment, and srun flags that follow the allocation.
# Sets PY and the array SRUN (the srun command line without the program).

# The project's virtual environment; CPU_DIST_PYTHON overrides (e.g. a shared install).
if [[ -n "${CPU_DIST_PYTHON:-}" ]]; then
    PY="${CPU_DIST_PYTHON}"
elif [[ -x "${ROOT}/.venv/bin/python" ]]; then
    PY="${ROOT}/.venv/bin/python"
else
    echo "$(basename "$0"): error: no ${ROOT}/.venv/bin/python; run scripts/setup.sh on a" \
        "node that shares this file system, or set CPU_DIST_PYTHON" >&2
    exit 2
fi

# scripts/env.sh keeps MPI traffic on loopback unless told otherwise, which is right for one
# node only. A job over several nodes keeps what the user exported, or lets OpenMPI choose.
_user_oob="${OMPI_MCA_oob_tcp_if_include-__unset__}"
_user_btl="${OMPI_MCA_btl_tcp_if_include-__unset__}"
# shellcheck source=../env.sh
source "${ROOT}/scripts/env.sh"
if [[ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]]; then
    [[ "${_user_oob}" == __unset__ ]] && unset OMPI_MCA_oob_tcp_if_include
    [[ "${_user_btl}" == __unset__ ]] && unset OMPI_MCA_btl_tcp_if_include
fi
unset _user_oob _user_btl
export PYTHONUNBUFFERED=1

# Threads per rank = CPUs Slurm gave each task (1 unless --cpus-per-task). Without binding
# (task/none) torch would start one OpenMP thread per CPU of the node in every rank; on a
# 2-core node with 3 ranks that made the training loop 2-8x slower than under mpirun, which
# binds ranks and so leaves torch one thread each.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}"

# One srun step over the whole allocation. --mpi=pmix: Debian's OpenMPI speaks only PMIx to
# srun (srun's own SLURM_MPI_TYPE still wins when exported). --kill-on-bad-exit: one failed
# rank ends the step instead of leaving the others in a collective. Slurm 22.05's srun does
# not inherit --cpus-per-task from sbatch, so it is passed on. CPU_DIST_SRUN_ARGS adds flags.
SRUN=(srun "--mpi=${SLURM_MPI_TYPE:-pmix}" --kill-on-bad-exit=1)
if [[ -n "${SLURM_CPUS_PER_TASK:-}" ]]; then
    SRUN+=("--cpus-per-task=${SLURM_CPUS_PER_TASK}")
fi
# shellcheck disable=SC2206  # word splitting is the point: several flags in one variable
SRUN+=(${CPU_DIST_SRUN_ARGS:-})
