"""The one place that turns a job's sparse mode into objects: the mode is the row of the table
of modes (``cpu_dist.common.modes.MODES``, data that validation reads too) that the job's
settings choose; the committer (its aggregation, hand-off and thread) and the step pipeline
are both built from that one :class:`SparseMode`, so their predicates cannot disagree, and
:func:`make_pipeline` maps each strategy name to its pipeline class."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mpi4py import MPI

from cpu_dist.common import modes
from cpu_dist.common.config import Config
from cpu_dist.common.contracts import TABLE
from cpu_dist.common.modes import Strategy
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


@dataclass(frozen=True)
class SparseMode:
    """How a job reads rows and hands off gradients (docs/DESIGN.md, "Read rows"): the row of
    ``cpu_dist.common.modes.MODES`` its flags choose."""

    strategy: Strategy
    # The aggregation learns the rows each step writes (an allgather of ids) for early pulls.
    exchange_ids: bool
    # Hand-offs on a thread of their own (the cache, the catch-up, the sole writer).
    background: bool


def sparse_mode(cfg: Config) -> SparseMode:
    """The first row of the table of modes whose requirements this job meets."""
    mode = modes.choose(modes.facts_of_config(cfg))
    return SparseMode(mode.strategy, mode.exchange_ids, mode.background)


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
        unknown = names if cfg.storage.expire_after else expiring
        return AsyncPrefetchPipeline(reads, committer, timer, dims, timeout_s, unknown)
    return DirectPipeline(reads, committer, timer, dims)
