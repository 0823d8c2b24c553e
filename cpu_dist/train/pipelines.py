"""How a worker reads a step's rows and hands off its sparse gradients: one small interface,
several strategies, so the training loop never branches on modes.

``DirectPipeline``    waits for the previous step's commit (with ``--sparse-sync async``, for
                      commit t-1-K only), then pulls every row.
``EarlyPullPipeline`` with pipelined commits: the next step's rows that this step did not
                      write are pulled during the dense phase (``cpu_dist.sparse.reads``).
the cache stage       ``gpu_cache.CachedRowReader`` (``--read-mode bagpipe``): a bounded row
                      cache in front of the PS, kept coherent with it.

Like TorchRec's train pipelines behind ``progress()``, each owns the sparse half of a step.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from mpi4py import MPI

from cpu_dist.common.config import Config
from cpu_dist.common.timing import PhaseTimer
from cpu_dist.data import Dataset
from cpu_dist.sparse import Client
from cpu_dist.sparse.aggregation import make_aggregation
from cpu_dist.sparse.commits import CommitSession, SparseCommitter, make_handoff
from cpu_dist.sparse.reads import EarlyPull


class StepPipeline(Protocol):
    def read(self, step: int, unique: np.ndarray) -> torch.Tensor:
        """Rows of ``unique`` (sorted int64) as after every commit before ``step``."""
        ...

    def submit(self, step: int, keys: np.ndarray, grads: np.ndarray) -> None:
        """Hand ``step``'s gradients of these rows to the PS."""
        ...

    def prefetch(self, step: int, unique: np.ndarray) -> None:
        """A hint: ``step``'s keys are known already (called after ``submit(step - 1)``)."""
        ...

    def wait_readable(self, step: int) -> None:
        """Block until every step before ``step`` is applied (evaluation, checkpoints)."""
        ...

    def finish(self, last_step: int) -> None:
        """Wait for the last commit, close the session and stop background work."""
        ...

    def metrics(self) -> dict[str, float]: ...


class DirectPipeline:
    def __init__(self, client: Client, committer: SparseCommitter, timer: PhaseTimer) -> None:
        self.client, self.committer, self.timer = client, committer, timer

    def read(self, step: int, unique: np.ndarray) -> torch.Tensor:
        with self.timer("commit_wait"):
            self.committer.wait_for_read(step)
        with self.timer("pull"):
            return torch.from_numpy(self.client.pull(unique))

    def submit(self, step: int, keys: np.ndarray, grads: np.ndarray) -> None:
        self.committer.submit(step, keys, grads)

    def prefetch(self, step: int, unique: np.ndarray) -> None:
        pass

    def wait_readable(self, step: int) -> None:
        self.committer.wait_readable(step)

    def finish(self, last_step: int) -> None:
        self.committer.finish(last_step)

    def metrics(self) -> dict[str, float]:
        return {}


class EarlyPullPipeline(DirectPipeline):
    def __init__(
        self, client: Client, committer: SparseCommitter, timer: PhaseTimer, timeout_s: float
    ) -> None:
        super().__init__(client, committer, timer)
        self.timeout_s = timeout_s
        self._early: EarlyPull | None = None

    def prefetch(self, step: int, unique: np.ndarray) -> None:
        self._early = EarlyPull(self.client, self.committer, step, unique, self.committer.written)

    def read(self, step: int, unique: np.ndarray) -> torch.Tensor:
        early, self._early = self._early, None
        if early is None or early.step != step:
            return super().read(step, unique)
        with self.timer("commit_wait"):
            self.committer.wait_for_read(step)
        with self.timer("pull"):
            return torch.from_numpy(early.finish(self.timeout_s))

    def finish(self, last_step: int) -> None:
        if self._early is not None:  # a hint for a step that never ran
            self._early.discard(self.timeout_s)
            self._early = None
        super().finish(last_step)


def _early_pull(cfg: Config) -> bool:
    """Rows the last step did not write may be pulled early, unless expiry can drop them at
    its commit (a drop is a write of that step that no worker knows of in advance)."""
    return cfg.cache is None and cfg.train.sparse_sync == "pipelined" and not cfg.table.expire_after


def make_committer(
    cfg: Config, client: Client, comm: MPI.Intracomm, session_id: int
) -> SparseCommitter:
    """The worker side of the commit protocol for these flags."""
    session = CommitSession(
        client,
        session_id,
        comm.Get_rank(),
        comm.Get_size(),
        lr=cfg.train.sparse_lr,
        optimizer=cfg.train.sparse_optimizer,
        barrier_timeout_s=cfg.job.barrier_timeout_s,
    )
    early_pull = _early_pull(cfg)
    staleness = cfg.train.max_staleness if cfg.train.sparse_sync == "async" else 0
    return SparseCommitter(
        session,
        make_aggregation(cfg.train.aggregation, comm, exchange_ids=early_pull),
        make_handoff(cfg.train.sparse_sync, session, cfg.client.rpc_timeout_s, staleness),
        # the cache keeps its rows coherent, so its hand-off may overlap the dense phase
        background=cfg.cache is not None,
    )


def make_pipeline(
    cfg: Config,
    client: Client,
    committer: SparseCommitter,
    comm: MPI.Intracomm,
    dataset: Dataset,
    timer: PhaseTimer,
) -> StepPipeline:
    """The one place that chooses a strategy from the flags."""
    if cfg.cache is not None:
        from gpu_cache import make_reader

        return make_reader(cfg, client, committer, comm, dataset, timer)
    if _early_pull(cfg):
        return EarlyPullPipeline(client, committer, timer, cfg.client.rpc_timeout_s)
    return DirectPipeline(client, committer, timer)
