"""The optional BagPipe cache stage (docs/DESIGN.md, "The cache stage"): a bounded cache of
embedding rows on each worker, in front of the PS, on the GPU when one exists and on the CPU
otherwise.

``make_reader`` builds the stage from the job's Config; the result reads and writes one table,
the fused ``embedding``, with ``read(step, keys)`` and ``submit(step, keys, grads)`` (see
gpu_cache/controller.py); ``CacheStage`` (``cpu_dist/train/pipelines/cache.py``) makes it the
worker loop's step pipeline, whose steps are dicts per table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from mpi4py import MPI

    from cpu_dist.common.config import Config
    from cpu_dist.common.timing import PhaseTimer
    from cpu_dist.data import Batch, Dataset
    from cpu_dist.sparse import Client
    from gpu_cache.controller import CachedRowReader, Commits


def scan_trace(
    dataset: Dataset,
    batch_size: int,
    steps: int,
    rank: int,
    world: int,
    keys_of: Callable[[Batch], np.ndarray],
) -> Iterator[np.ndarray]:
    """This worker's sorted unique keys of each training step, read before training: only
    this worker's share of each batch, prepared on a background thread; ``keys_of`` gives a
    batch's keys of the cached table as the step will read them (its bags included)."""
    import numpy as np

    from cpu_dist.data import WorkerBatches

    with WorkerBatches(dataset, batch_size, 0, rank, world, stop_step=steps) as batches:
        for _, batch in batches:
            yield np.unique(keys_of(batch))


def make_reader(
    cfg: Config,
    client: Client,
    committer: Commits,
    comm: MPI.Intracomm,
    dataset: Dataset,
    phases: PhaseTimer | None = None,
) -> CachedRowReader:
    """The CachedRowReader for ``--read-mode bagpipe`` (prescan plans built here)."""
    from gpu_cache.bypass import LowHitBypass
    from gpu_cache.controller import CachedRowReader
    from gpu_cache.plans import OnlinePlanner, PrescanPlanner

    cache = cfg.cache
    assert cache is not None, "make_reader needs --read-mode bagpipe"
    if not cfg.tables.fused:  # validate refuses it; the stage checks its own boundary too
        raise ValueError(
            f"the cache stage serves the flags' one fused table only, not the tables "
            f"{', '.join(cfg.tables.names)} of --config {cfg.tables.source}"
        )
    rank, world = comm.Get_rank(), comm.Get_size()
    planner: OnlinePlanner | PrescanPlanner
    if cache.prescan:
        from cpu_dist.data.features import BatchFeatures

        features = BatchFeatures(cfg.tables, dataset.kind, getattr(dataset, "offsets", None))
        trace = scan_trace(
            dataset,
            cfg.train.batch_size,
            cfg.train.max_step,
            rank,
            world,
            lambda batch: features(batch).values().numpy(),
        )
        planner = PrescanPlanner(comm, trace, window=cache.plan_window)
    else:
        planner = OnlinePlanner(comm)
    return CachedRowReader(
        client,
        committer,
        planner,
        dim=cfg.model.embedding_dim,
        capacity_units=cache.capacity_units,
        lr=cfg.train.sparse_lr,
        aggregation=cfg.train.aggregation,
        world=world,
        bypass=LowHitBypass(cache.bypass_below),
        phases=phases,
    )
