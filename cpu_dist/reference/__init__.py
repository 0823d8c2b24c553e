"""The single-process reference: the job's model, as written, trained in one process on the
job's global batches.  The yardstick of the equivalence tests, and ``python -m
cpu_dist.reference [the job's flags and job file]`` for users who want to check a job.

Nothing here is distributed: the model comes from the job's own builder
(:func:`cpu_dist.train.job_model.build_job_model`, so its dense init equals the workers'),
its ``EmbeddingBagCollection``\\ s keep their local lazy rows (first touch from
``contracts.row_init`` as a shard's, each table's optimizer and rules in the shard's
arithmetic, :mod:`cpu_dist.embeddings.rows`), and the batches become features through the
job's one conversion (:class:`cpu_dist.data.features.BatchFeatures`).  Per global batch:
``BCEWithLogitsLoss`` over the batch, backward, each table's sparse step, the dense optimizer
(``torch.optim.SGD`` / ``AdamW``, the job's).  The synchronous contract says a job equals
this to rounding for any worker count and bit for bit across shard counts.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from cpu_dist.common.config import Config
from cpu_dist.data import Batch, Dataset, dataset_for, train_batches
from cpu_dist.data.features import BatchFeatures
from cpu_dist.data.run_length import run_length
from cpu_dist.dense.allreduce import make_dense_optimizer, set_rate
from cpu_dist.embeddings import collections_of
from cpu_dist.models.outputs import logits_of
from cpu_dist.train.dump import model_arrays
from cpu_dist.train.job_model import build_job_model

__all__ = ["ReferenceTrainer", "train_reference"]


class ReferenceTrainer:
    """The reference's state and one training step; :func:`train_reference` drives it.

    Args:
        cfg: the job's Config (its model, tables, optimizers, seeds and dtype).
        dataset: the job's data (default: ``dataset_for(cfg.data, cfg.train.seed)``).
        start_step: the step the first :meth:`step` trains (its rules count from there).

    Example::

        trainer = ReferenceTrainer(cfg)
        for step, batch in train_batches(trainer.dataset, cfg.train.batch_size):
            trainer.step(batch)
    """

    def __init__(self, cfg: Config, dataset: Dataset | None = None, start_step: int = 0) -> None:
        self.cfg = cfg
        self.dataset = dataset if dataset is not None else dataset_for(cfg.data, cfg.train.seed)
        self.features = BatchFeatures(
            cfg.tables, self.dataset.kind, getattr(self.dataset, "offsets", None)
        )
        self.model = build_job_model(cfg, self.dataset.num_dense)
        self.dtype = torch.float64 if cfg.model.dtype == "float64" else torch.float32
        self.collections = [ebc for _, ebc in collections_of(self.model)]
        for ebc in self.collections:
            start = getattr(ebc.row_source, "start_at", None)
            if start is not None:
                start(start_step)
        self.optimizer = make_dense_optimizer(
            cfg.train.dense_optimizer,
            self.model.parameters(),
            cfg.train.lr,
            cfg.train.dense_optimizer_args,
        )
        self.loss_fn = nn.BCEWithLogitsLoss()
        self.t = start_step  # the step the next call of step() trains

    def _logits(self, batch: Batch) -> torch.Tensor:
        dense = torch.from_numpy(batch.dense).to(self.dtype)
        return logits_of(self.model(dense, self.features(batch)), len(batch), self.cfg.model.name)

    def step(self, batch: Batch) -> float:
        """One synchronous step on a global batch; returns the loss before the update."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self._logits(batch), torch.from_numpy(batch.labels).to(self.dtype))
        loss.backward()
        schedule, t = self.cfg.train.schedule, self.t
        for ebc in self.collections:  # each table at its scheduled rate, as its commit
            ebc.sparse_step({c.name: schedule.rate(c.lr, t) for c in ebc.embedding_bag_configs()})
        if not schedule.constant:
            set_rate(self.optimizer, schedule.rate(self.cfg.train.lr, t))
        self.optimizer.step()
        self.t += 1
        return float(loss.item())

    @torch.no_grad()
    def predict(self, batch: Batch) -> np.ndarray:
        """Logits (float64) of a batch; unseen ids read as their first-touch rows."""
        self.model.eval()
        try:
            return self._logits(batch).double().numpy()
        finally:
            self.model.train()

    def table_rows(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per table, the rows a shard would hold: (sorted ids, float32 [n, dim])."""
        out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for ebc in self.collections:
            out.update(ebc.table_rows())
        return out

    def dump(self) -> dict[str, np.ndarray]:
        """The ``--dump-state`` layout (:mod:`cpu_dist.train.dump`)."""
        return model_arrays(self.model, self.table_rows())


def train_reference(
    cfg: Config, dataset: Dataset | None = None, steps: int | None = None, start_step: int = 0
) -> dict[str, np.ndarray]:
    """Train steps ``[start_step, start_step + steps)`` (default: to ``--max_step``) from
    fresh weights; returns the ``--dump-state`` dict: ``dense/<name>`` for every dense
    parameter and per table ``table/<name>/keys`` (int64, sorted: every row a shard would
    hold) and ``table/<name>/values`` (float32).  File data that ends earlier ends the run
    earlier, as it does the job's."""
    trainer = ReferenceTrainer(cfg, dataset, start_step)
    if steps is None:  # the job's own step count (file data: its epochs, unless --max_step)
        steps = run_length(cfg.train, cfg.data, trainer.dataset).steps - start_step
    end = start_step + steps
    for step, batch in train_batches(trainer.dataset, cfg.train.batch_size, start_step):
        if step >= end:
            break
        trainer.step(batch)
    return trainer.dump()
