"""One rank's part of a job, after flags are checked and roles are split."""

from __future__ import annotations

import signal
import sys
from contextlib import nullcontext

from cpu_dist.checkpoint.manifest import CheckpointError
from cpu_dist.checkpoint.owner import Owner
from cpu_dist.common.config import Config, ModelError
from cpu_dist.common.files import OutputError
from cpu_dist.common.mpi_context import (
    EXIT_STOPPED,
    STOP,
    Roles,
    agree_exit_code,
    exchange_ps_addresses,
    ps_listen_host,
    share_job_secret,
)
from cpu_dist.common.parquet_schema import ParquetError
from cpu_dist.common.threads import node_share, share_cores, yield_to_shards
from cpu_dist.common.tokens import TokenError, external_token
from cpu_dist.data.layout import LayoutError
from cpu_dist.data.run_length import RunLengthError
from cpu_dist.data.tsv_parse import CriteoFormatError
from cpu_dist.serving.errors import BundleError
from cpu_dist.sparse import PSError
from cpu_dist.train.errors import NonFiniteLoss
from cpu_dist.train.preflight import SetupError, preflight
from cpu_dist.train.user_metric import MetricError

# Failures a user can cause and fix, reported as one ``launcher.py: error:`` line with exit
# code 2 (``run_or_abort``): a shard lost or refusing, a checkpoint or data file that cannot be
# used (a Parquet row group found bad mid-run too: the checkpoints written before it stay
# valid), an output path refused, a bound that ran out, memory that cannot be had.  Anything
# else is a bug and keeps its traceback.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (
    PSError,
    CheckpointError,
    TokenError,
    CriteoFormatError,
    ParquetError,  # type, null, lengths, a corrupt page: the file, the column (and the row)
    LayoutError,
    RunLengthError,
    NonFiniteLoss,
    BundleError,
    ModelError,
    MetricError,  # a --metric that cannot be loaded, made or computed
    OutputError,
    TimeoutError,
    MemoryError,
)


def is_expected_error(exc: BaseException) -> bool:
    """``EXPECTED_ERRORS``, and torch's CPU allocator refusing memory: it raises a plain
    RuntimeError ("DefaultCPUAllocator: can't allocate memory: you tried to allocate N
    bytes"), not MemoryError."""
    if isinstance(exc, EXPECTED_ERRORS):
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def _name_shard_rank(exc: PSError, roles: Roles, external: bool) -> PSError:
    """The same error, its message prefixed with the world rank of the shard it names (a PS
    rank of this job), so that a lost PS rank is named the way mpirun names ranks.  The
    shard, its address and the status code are the error's attributes (no parsing)."""
    shard = getattr(exc, "shard", None)
    if shard is None or external:
        return exc
    renamed = PSError(f"PS shard {shard} = world rank {roles.worker_num + shard}: {exc}")
    for attr in ("shard", "address", "code"):
        try:
            setattr(renamed, attr, getattr(exc, attr, None))
        except AttributeError:  # a binding whose attributes are read-only keeps its own
            pass
    return renamed


def run_job(cfg: Config, roles: Roles) -> int:
    external = cfg.job.external_shards
    if cfg.checkpoint.dir is not None:  # SIGTERM/SIGUSR1: checkpoint at the next step, stop
        STOP.install()
    # Rank 0 alone reads the external token and checks the surroundings; every rank gets
    # the same verdict, and rank 0 speaks for all.
    shards_token, problem = None, None
    if roles.rank == 0 and external:
        try:
            shards_token = external_token(cfg.job.token_file)
        except TokenError as exc:
            problem = str(exc)
    problem = roles.world.bcast(problem, root=0)
    token, session = share_job_secret(roles, shards_token) if problem is None else ("", 0)
    if problem is not None:
        raise SetupError(problem)  # every rank: rank 0 prints it (run_or_abort), all exit 2
    owner = preflight(cfg, roles, token)  # world rank 0's hold on --checkpoint-dir
    try:
        # The heartbeat is renewed on a thread of its own from the claim to the end: start-up
        # (the model, the data, a resume's load of every shard) can outlast the lease before
        # the first step renews it, and a run on another host would then take the directory.
        with owner.kept_alive("the job") if owner is not None else nullcontext():
            return _run_roles(cfg, roles, token, session, owner)
    finally:  # every exit the job controls frees the directory (a stop's too: it requeues)
        if owner is not None:
            owner.release()


def _run_roles(cfg: Config, roles: Roles, token: str, session: int, owner: Owner | None) -> int:
    """The job after the preflight: PS ranks serve, workers train; the agreed exit code."""
    external = cfg.job.external_shards
    job_host = ps_listen_host(roles, cfg.job.ps_host, cfg.job.ps_interface)
    if cfg.job.ps_type.lower() == "rdma":
        if any(roles.world.allgather(job_host != "127.0.0.1")):  # one verdict for all ranks
            raise SetupError(
                "--ps-type RDMA: no RDMA transport exists yet; on one node it selects the "
                "local gRPC backend, across nodes use --ps-type grpc"
            )
        if roles.rank == 0:
            print(
                "cpu_dist: --ps-type RDMA on a single node: using the local gRPC backend",
                file=sys.stderr,
                flush=True,
            )

    node = node_share(roles.world, roles.is_worker)
    stopped = False
    if roles.is_worker:
        yield_to_shards(node, cfg.job.worker_nice)  # before any thread of the worker's starts
        threads = share_cores(node, cfg.job.worker_threads)  # before torch's first import
        from cpu_dist.train.loop import train_worker

        addresses = (
            list(cfg.job.ps_list)
            if external
            else exchange_ps_addresses(roles, None, None, cfg.job.barrier_timeout_s)
        )
        try:
            stopped = train_worker(
                cfg, roles, token, session, addresses, not external, owner, threads
            )
        except PSError as exc:
            renamed = _name_shard_rank(exc, roles, external)
            if renamed is exc:
                raise
            raise renamed from exc
    else:
        from cpu_dist.train.ps_rank import run_ps_rank

        run_ps_rank(cfg, roles, token, job_host)
    # PS ranks wait here for the whole run: training, evaluation and the last checkpoint.
    # Every rank leaves with the job's code: EXIT_STOPPED when the workers stopped on request.
    code = EXIT_STOPPED if stopped else 0
    agreed = agree_exit_code(roles.world, code, cfg.job.barrier_timeout_s, "end of job")
    if agreed == EXIT_STOPPED:
        # Every rank now leaves with 75.  The first to go is a "bad exit" to srun
        # (--kill-on-bad-exit) and to mpirun, which SIGTERM the rest: one still on its way out
        # would die of it (143) and srun's code would no longer say "stopped, requeue me".
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return agreed
