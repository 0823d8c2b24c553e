"""How a worker reads a step's rows and hands off its sparse gradients: one small interface,
several strategies, so the training loop never branches on modes.

``DirectPipeline``    waits for the previous step's commit (with ``--sparse-sync async``, for
                      commit t-1-K only), then pulls every row.
``EarlyPullPipeline`` with pipelined commits: the next step's rows that this step did not
                      write are pulled during the dense phase (``cpu_dist.sparse.reads``).
``AsyncPrefetchPipeline`` with ``--sparse-sync async`` and K >= 1: the next step's rows are
                      all pulled during the dense phase; the shards' replies say whether they
                      hold every commit the staleness bound needs.
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
from cpu_dist.sparse import Client, Handle
from cpu_dist.sparse.aggregation import make_aggregation
from cpu_dist.sparse.commits import CommitSession, SparseCommitter, make_handoff
from cpu_dist.sparse.reads import EarlyPull, written_by


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


class AsyncPrefetchPipeline(DirectPipeline):
    """``--sparse-sync async`` with K >= 1.  Step t+1's rows that step t does not write are
    pulled as soon as its keys are known (during step t), naming the commit session so that
    each shard's reply says which commits they hold; at the read, the worker waits only for
    commit t-K (the asynchronous rule: usually no wait, one round trip that also learns how
    far the shards are) and pulls the rows step t writes.  So a read waits for no other
    worker, yet holds commit t whenever it is applied by then (the staleness metrics say how
    often it was not).  Early rows that miss a commit the rule needs are pulled again."""

    def __init__(
        self,
        client: Client,
        committer: SparseCommitter,
        timer: PhaseTimer,
        timeout_s: float,
        writes_known: bool,
    ) -> None:
        super().__init__(client, committer, timer)
        self.timeout_s, self.writes_known = timeout_s, writes_known
        self._early: tuple[int, np.ndarray, np.ndarray, Handle] | None = None
        self.reads_early = self.reads_again = 0  # early rows used / pulled again

    def prefetch(self, step: int, unique: np.ndarray) -> None:
        self.committer.drain()
        written = self.committer.written if self.writes_known else None
        dependent = written_by(unique, written)
        handle = self.client.pull_async(unique[~dependent], session=self.committer.session.id)
        self._early = (step, unique, dependent, handle)

    def read(self, step: int, unique: np.ndarray) -> torch.Tensor:
        early, self._early = self._early, None
        if early is None or early[0] != step or not np.array_equal(early[1], unique):
            if early is not None:
                early[3].wait(self.timeout_s)  # a hint for another step: let it end
            return super().read(step, unique)
        _, _, dependent, handle = early
        with self.timer("commit_wait"):
            self.committer.wait_for_read(step)  # commit step-1-K; records the staleness
        with self.timer("pull"):
            rows = np.empty((len(unique), self.client.dim), dtype=np.float32)
            rows[dependent] = self.client.pull(unique[dependent])
            rows[~dependent] = handle.wait(self.timeout_s)
            # Rows step-1 does not write are as after commit step-1 once they hold step-2;
            # else they hold what the shards had applied when they were pulled.
            seen = handle.committed_step()
            held = step - 1 if seen is None else self.committer.session.base + seen
            if held < step - 2 and held < step - 1 - self.committer.handoff.staleness:
                self.reads_again += 1
                rows[~dependent] = self.client.pull(unique[~dependent])
            else:
                self.reads_early += 1
                if held < step - 2:  # staler than the shards' commit the wait learned
                    self.committer.staler_read(step, held)
        return torch.from_numpy(rows)

    def finish(self, last_step: int) -> None:
        if self._early is not None:  # a hint for a step that never ran
            self._early[3].wait(self.timeout_s)
            self._early = None
        super().finish(last_step)

    def metrics(self) -> dict[str, float]:
        return {"reads_early": self.reads_early, "reads_pulled_again": self.reads_again}


def _early_pull(cfg: Config) -> bool:
    """Rows the last step did not write may be pulled early, unless expiry can drop them at
    its commit (a drop is a write of that step that no worker knows of in advance)."""
    return cfg.cache is None and cfg.train.sparse_sync == "pipelined" and not cfg.table.expire_after


def _async_prefetch(cfg: Config) -> bool:
    return cfg.cache is None and cfg.train.sparse_sync == "async" and cfg.train.max_staleness > 0


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
        # the early pulls need the rows each step writes (an allgather of its ids)
        make_aggregation(
            cfg.train.aggregation, comm, exchange_ids=early_pull or _async_prefetch(cfg)
        ),
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
    if _async_prefetch(cfg):
        # with expiry a commit may drop any row: then every row counts as written
        known = not cfg.table.expire_after
        return AsyncPrefetchPipeline(client, committer, timer, cfg.client.rpc_timeout_s, known)
    return DirectPipeline(client, committer, timer)
