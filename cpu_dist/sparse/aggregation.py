"""Who sums a step's sparse gradients (``--aggregation``), as strategies of one method.

``ps``          every worker sends the gradients of its own unique rows; each shard sums all
                workers' chunks in rank order, divides by W and runs the optimizer once per row.
``collective``  workers all-reduce the gradients of the union of their rows over MPI; each row
                is then sent by one designated worker (every worker still sends its markers),
                and the shard divides by W as before.

Both give the PS the step's summed gradients once per row; ``collective`` adds them in the
order MPI's all-reduce chooses, not rank order, so the two agree to rounding (the equivalence
tests hold them to rtol 1e-5), and each is bit for bit reproducible on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from mpi4py import MPI

from cpu_dist.common.mpi_context import allgather_keys
from cpu_dist.common.sorted_keys import find_sorted


@dataclass(frozen=True)
class Outgoing:
    """What this worker hands to the PS for one step, and what the step changes."""

    keys: np.ndarray  # the rows this worker sends (sorted unique int64)
    grads: np.ndarray  # their gradients, float32 [len(keys), dim]
    # Sorted union of every worker's rows of the step: the rows its commit writes.  None when
    # it was neither known nor exchanged (ps aggregation without a reader that needs it).
    written: np.ndarray | None = None
    # collective: the all-reduced gradient of every row of ``written`` (the cache stage
    # applies it to its copies); None under ps aggregation.
    summed: np.ndarray | None = None


class Aggregation(Protocol):
    def reduce(
        self, keys: np.ndarray, grads: np.ndarray, union: np.ndarray | None = None
    ) -> Outgoing:
        """``union``: the sorted union of every worker's keys of this step when the caller
        already knows it (then no id exchange happens); every worker passes one, or none."""
        ...


def key_union(comm: MPI.Intracomm, keys: np.ndarray) -> np.ndarray:
    """The sorted union of every worker's keys (the step's id metadata exchange)."""
    return np.unique(allgather_keys(comm, keys))


class PsAggregation:
    """``exchange_ids``: learn the step's written rows (an allgather of ids) even when no
    caller passes them, for readers that pull the other rows early."""

    def __init__(self, comm: MPI.Intracomm, exchange_ids: bool = False) -> None:
        self.comm, self.exchange_ids = comm, exchange_ids

    def reduce(
        self, keys: np.ndarray, grads: np.ndarray, union: np.ndarray | None = None
    ) -> Outgoing:
        if union is None and self.exchange_ids:
            union = key_union(self.comm, keys)
        return Outgoing(keys, grads, union, None)


class CollectiveAggregation:
    def __init__(self, comm: MPI.Intracomm) -> None:
        self.comm = comm
        self.rank, self.world = comm.Get_rank(), comm.Get_size()

    def reduce(
        self, keys: np.ndarray, grads: np.ndarray, union: np.ndarray | None = None
    ) -> Outgoing:
        if union is None:
            union = key_union(self.comm, keys)
        at, found = find_sorted(union, keys)
        if not found.all():
            raise ValueError(
                f"rank {self.rank}: the step's key union does not hold every key of this worker"
            )
        summed = np.zeros((len(union), grads.shape[1]), dtype=np.float32)
        summed[at] = grads
        self.comm.Allreduce(MPI.IN_PLACE, summed, op=MPI.SUM)
        # The designated sender of a row: a function of the key every worker computes alike.
        mine = (union % self.world) == self.rank
        return Outgoing(union[mine], summed[mine], union, summed)


def make_aggregation(kind: str, comm: MPI.Intracomm, exchange_ids: bool = False) -> Aggregation:
    if kind == "ps":
        return PsAggregation(comm, exchange_ids)
    if kind == "collective":
        return CollectiveAggregation(comm)
    raise ValueError(f"aggregation {kind!r}: expected ps or collective")
