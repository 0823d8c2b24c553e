"""The optional BagPipe cache stage (DESIGN.md section 4): a bounded cache of embedding rows
on each worker, in front of the PS, on the GPU when one exists and on the CPU otherwise.

``make_reader`` builds the stage from the launcher's flags; the worker loop then reads rows
with ``reader.read(step, keys)`` and calls ``reader.submit(step, keys, grads)`` instead of the
updater's submit (see gpu_cache/controller.py).
"""

from __future__ import annotations


def scan_trace(dataset, batch_size: int, steps: int, rank: int, world: int):
    """This worker's sorted unique keys of each training step, read before training."""
    import numpy as np

    from cpu_dist.data import train_batches

    batches = train_batches(dataset, batch_size)
    for _ in range(steps):
        item = next(batches, None)
        if item is None:
            return
        yield np.unique(item[1].shard(rank, world).keys.reshape(-1))


def make_reader(args, client, updater, comm, dataset):
    """The CachedRowReader for ``--read-mode bagpipe`` (prescan plans built here)."""
    from gpu_cache.bypass import LowHitBypass
    from gpu_cache.controller import CachedRowReader
    from gpu_cache.plans import OnlinePlanner, PrescanPlanner

    rank, world = comm.Get_rank(), comm.Get_size()
    if args.optimization_prescan:
        trace = scan_trace(dataset, args.batch_size, args.max_step, rank, world)
        planner = PrescanPlanner(comm, trace, window=args.optimization_plan_window)
    else:
        planner = OnlinePlanner(comm)
    return CachedRowReader(
        client,
        updater,
        planner,
        dim=args.embedding_dim,
        capacity_units=args.optimization_cache_capacity,
        lr=args.sparse_lr,
        aggregation=args.aggregation,
        world=world,
        bypass=LowHitBypass(args.optimization_bypass_below),
    )
