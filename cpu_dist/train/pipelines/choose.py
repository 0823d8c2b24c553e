"""The one place that reads the flags to choose a job's sparse mode: the committer (its
aggregation, hand-off and thread) and the step pipeline are both built from one
:class:`SparseMode`, so their predicates cannot disagree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from mpi4py import MPI

from cpu_dist.common.config import Config
from cpu_dist.common.contracts import TABLE
from cpu_dist.common.timing import PhaseTimer
from cpu_dist.data import Dataset
from cpu_dist.sparse import Client
from cpu_dist.sparse.aggregation import make_aggregation
from cpu_dist.sparse.commits import CommitSession, SparseCommitter, make_handoff
from cpu_dist.sparse.reads import TableReads
from cpu_dist.train.pipelines.base import DirectPipeline, StepPipeline
from cpu_dist.train.pipelines.cache import CacheStage
from cpu_dist.train.pipelines.catch_up import CatchUpPipeline, CatchUpTable
from cpu_dist.train.pipelines.early import AsyncPrefetchPipeline, EarlyPullPipeline
from cpu_dist.train.pipelines.sole_writer import SoleWriterPipeline

if TYPE_CHECKING:
    from gpu_cache import TableKeysOf

Strategy = Literal["cache", "catch_up", "sole_writer", "early_pull", "async_prefetch", "direct"]


@dataclass(frozen=True)
class SparseMode:
    """How a job reads rows and hands off gradients (docs/DESIGN.md, "Read rows")."""

    strategy: Strategy
    # The aggregation learns the rows each step writes (an allgather of ids) for early pulls.
    exchange_ids: bool
    # Hand-offs on a thread of their own: the cache and the catch-up keep their rows
    # coherent themselves, so the hand-off may overlap the dense phase.
    background: bool


def sparse_mode(cfg: Config) -> SparseMode:
    t, tables = cfg.train, cfg.tables.tables
    expiry = bool(cfg.table.expire_after) or any(x.expire_after for x in tables)
    rules = bool(cfg.table.admit_after) or any(x.has_rules for x in tables)
    strategy: Strategy = "direct"
    if cfg.cache is not None:
        strategy = "cache"
    elif (
        t.sparse_sync in ("pipelined", "async")
        and t.aggregation == "collective"
        and not (rules or expiry)
    ):
        # the worker holds every step's summed gradients and no table rule decides at the
        # shard what a commit touches: reads are brought up to date instead of waiting
        strategy = "catch_up"
    elif (
        cfg.job.worker_num == 1
        and t.sparse_sync == "pipelined"
        and t.aggregation == "ps"
        and not (rules or expiry)
        and cfg.client.compression == "none"
        and all(x.optimizer == "sgd" for x in tables)
    ):
        # every commit is this worker's own SGD step: it brings its rows forward itself
        strategy = "sole_writer"
    elif t.sparse_sync == "pipelined" and not expiry:
        # expiry can drop a row at its commit: a write of that step no worker knows of
        strategy = "early_pull"
    elif t.sparse_sync == "async" and t.max_staleness > 0:
        strategy = "async_prefetch"
    return SparseMode(
        strategy,
        exchange_ids=strategy in ("early_pull", "async_prefetch"),
        background=strategy in ("cache", "catch_up", "sole_writer"),
    )


def make_committer(
    cfg: Config, client: Client, comm: MPI.Intracomm, session_id: int
) -> SparseCommitter:
    """The worker side of the commit protocol for these flags."""
    mode = sparse_mode(cfg)
    session = CommitSession(
        client,
        session_id,
        comm.Get_rank(),
        comm.Get_size(),
        lr=cfg.train.sparse_lr,
        optimizer=cfg.train.sparse_optimizer,
        barrier_timeout_s=cfg.job.barrier_timeout_s,
        table_lrs=None if cfg.tables.fused else {t.name: t.lr for t in cfg.tables.tables},
        schedule=cfg.train.schedule,
    )
    staleness = cfg.train.max_staleness if cfg.train.sparse_sync == "async" else 0
    return SparseCommitter(
        session,
        make_aggregation(cfg.train.aggregation, comm, exchange_ids=mode.exchange_ids),
        make_handoff(cfg.train.sparse_sync, session, cfg.client.rpc_timeout_s, staleness),
        background=mode.background,
    )


def make_pipeline(
    cfg: Config,
    client: Client,
    committer: SparseCommitter,
    comm: MPI.Intracomm,
    dataset: Dataset,
    timer: PhaseTimer,
    keys_of: TableKeysOf | None = None,
) -> StepPipeline:
    """The job's step pipeline: every strategy over the job's tables, the default job's one
    (``embedding``) in the one-table wire form.  ``keys_of``: a batch's sorted unique keys
    per table, as the model's collections look them up (the cache's prescan reads them)."""
    strategy = sparse_mode(cfg).strategy
    fused, timeout_s = cfg.tables.fused, cfg.client.rpc_timeout_s
    names = [TABLE] if fused else list(cfg.tables.names)
    dims = {TABLE: client.dim} if fused else cfg.tables.dims
    reads = TableReads(client, names, one_table=fused)
    if strategy == "cache":
        from gpu_cache import make_readers

        assert keys_of is not None, "the cache stage needs the batches' keys per table"
        readers, planner = make_readers(cfg, reads, committer, comm, dataset, keys_of)
        return CacheStage(readers, reads, committer, planner, timer)
    if strategy == "catch_up":
        tables = [CatchUpTable(t.name, t.dim, t.optimizer, t.lr, t.eps) for t in cfg.tables.tables]
        if fused:  # the session's one-table form: its lr and optimizer
            tables = [
                CatchUpTable(TABLE, client.dim, cfg.train.sparse_optimizer, cfg.train.sparse_lr)
            ]
        return CatchUpPipeline(reads, committer, timer, timeout_s, cfg.client.compression, tables)
    if strategy == "sole_writer":
        return SoleWriterPipeline(reads, committer, timer, dims, timeout_s)
    if strategy == "early_pull":
        return EarlyPullPipeline(reads, committer, timer, dims, timeout_s)
    if strategy == "async_prefetch":
        # with expiry a commit may drop any row of its table: all count as written
        expiring = [t.name for t in cfg.tables.tables if t.expire_after]
        unknown = names if cfg.table.expire_after else expiring
        return AsyncPrefetchPipeline(reads, committer, timer, dims, timeout_s, unknown)
    return DirectPipeline(reads, committer, timer, dims)
