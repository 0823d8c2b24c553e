"""The optional BagPipe cache stage (docs/DESIGN.md, "The cache stage"): a bounded cache of
embedding rows on each worker, in front of the PS, on the GPU when one exists and on the CPU
otherwise.

``make_readers`` builds one cache per table of the job from its Config (each a
``CachedRowReader``, gpu_cache/controller.py, with ``read(step, keys)`` and ``submit(step,
keys, grads)``); ``CacheStage`` (``cpu_dist/train/pipelines/cache.py``) runs them together as
the worker loop's step pipeline, whose steps are dicts per table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from mpi4py import MPI

    from cpu_dist.common.config import Config
    from cpu_dist.data import Batch, Dataset
    from cpu_dist.sparse.reads import TableReads
    from gpu_cache.controller import CachedRowReader, Commits
    from gpu_cache.plans import OnlineTablesPlanner

# A batch's sorted unique keys of each table, as the step will read them (its bags included).
TableKeysOf = Callable[["Batch"], Mapping[str, "np.ndarray"]]


def scan_trace(
    dataset: Dataset,
    batch_size: int,
    steps: int,
    rank: int,
    world: int,
    keys_of: TableKeysOf,
) -> Iterator[Mapping[str, np.ndarray]]:
    """This worker's sorted unique keys of each training step and table, read before
    training: only this worker's share of each batch, prepared on a background thread."""
    from cpu_dist.data import WorkerBatches

    with WorkerBatches(dataset, batch_size, 0, rank, world, stop_step=steps) as batches:
        for _, batch in batches:
            yield keys_of(batch)


def fused_trace(
    dataset: Dataset, batch_size: int, steps: int, rank: int = 0, world: int = 1
) -> Iterator[np.ndarray]:
    """:func:`scan_trace` of a job without a job file (the flags' one fused table): what the
    cache benchmarks plan and size their caches from."""
    import numpy as np

    from cpu_dist.common.contracts import TABLE
    from cpu_dist.common.tables import flag_table
    from cpu_dist.data.features import BatchFeatures

    tables = flag_table(
        dim=1, optimizer="sgd", lr=1.0, init_scale=1.0, admit_after=0, expire_after=0
    )
    features = BatchFeatures(tables, dataset.kind, getattr(dataset, "offsets", None))

    def keys_of(batch: Batch) -> dict[str, np.ndarray]:
        return {TABLE: np.unique(features(batch).values().numpy())}

    for keys in scan_trace(dataset, batch_size, steps, rank, world, keys_of):
        yield keys[TABLE]


def make_readers(
    cfg: Config,
    reads: TableReads,
    committer: Commits,
    comm: MPI.Intracomm,
    dataset: Dataset,
    keys_of: TableKeysOf,
) -> tuple[dict[str, CachedRowReader], OnlineTablesPlanner | None]:
    """Every table's cache for ``--read-mode bagpipe`` (in the job's table order, each sized
    by ``CacheConfig.table_units``), and the online planner of all tables (None with prescan
    plans, which each cache builds here from one scan of the trace)."""
    from cpu_dist.sparse.reads import OneTableReads
    from gpu_cache.bypass import LowHitBypass
    from gpu_cache.controller import CachedRowReader
    from gpu_cache.plans import OnlinePlanner, OnlineTablesPlanner, PrescanPlanner

    cache = cfg.cache
    assert cache is not None, "make_readers needs --read-mode bagpipe"
    tables = cfg.tables.tables
    units = cache.table_units(cfg.tables, cfg.model.embedding_dim)
    rank, world = comm.Get_rank(), comm.Get_size()
    planners: dict[str, OnlinePlanner | PrescanPlanner] = {}
    if cache.prescan:
        traces: dict[str, list[np.ndarray]] = {t.name: [] for t in tables}
        for step_keys in scan_trace(
            dataset, cfg.train.batch_size, cfg.train.max_step, rank, world, keys_of
        ):
            for name, trace in traces.items():
                trace.append(step_keys[name])
        for t in tables:  # each table's trace is exchanged once, at start-up
            planners[t.name] = PrescanPlanner(comm, traces.pop(t.name), window=cache.plan_window)
    else:
        planners = {t.name: OnlinePlanner(comm) for t in tables}
    readers = {
        t.name: CachedRowReader(
            OneTableReads(reads, t.name),
            committer,
            planners[t.name],
            dim=t.dim,
            capacity_units=units[t.name],
            lr=t.lr,
            schedule=cfg.train.schedule,
            aggregation=cfg.train.aggregation,
            world=world,
            bypass=LowHitBypass(cache.bypass_below),
        )
        for t in tables
    }
    return readers, None if cache.prescan else OnlineTablesPlanner(comm)
