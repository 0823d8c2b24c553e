# Environment for running MPI jobs from this project (sourced by the project's scripts).
# OpenMPI refuses root without these, and more ranks than cores need oversubscription.
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Keep MPI's own traffic on loopback for single-node runs (override for multi-node jobs).
export OMPI_MCA_oob_tcp_if_include="${OMPI_MCA_oob_tcp_if_include:-lo}"
export OMPI_MCA_btl_tcp_if_include="${OMPI_MCA_btl_tcp_if_include:-lo}"
# No binding: workers share the node's cores among themselves (cpu_dist/common/threads.py)
# and PS ranks serve from gRPC threads; pinning each rank to one core would idle the rest.
export OMPI_MCA_hwloc_base_binding_policy="${OMPI_MCA_hwloc_base_binding_policy:-none}"
# A rank waiting in MPI should yield its core to the PS threads beside it.
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
# glibc: keep large reply buffers out of fresh mmap/munmap on every call (docs/DESIGN.md,
# "Measured facts").
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-33554432}"
export MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-268435456}"
# A SIGTERM to mpirun starts OpenMPI's kill sequence: SIGCONT to the ranks, a wait, SIGTERM, the
# same wait, SIGKILL; the wait is odls_base_sigkill_timeout seconds (1 by default), too short to
# checkpoint in.  CPU_DIST_STOP_GRACE_S=N makes it N: ranks then get SIGTERM N s after mpirun
# and have N s to checkpoint (docs/operations.md, "Stopping and preemption").  Not the
# default: every failing job then also takes 2N s to end.  SIGUSR1 to mpirun (scripts/run.sh
# turns SIGTERM into it) reaches the ranks at once and needs no grace.
if [[ -n "${CPU_DIST_STOP_GRACE_S:-}" ]]; then
    export OMPI_MCA_odls_base_sigkill_timeout="${CPU_DIST_STOP_GRACE_S}"
fi
