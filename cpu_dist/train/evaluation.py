"""Held-out evaluation of the distributed model: every worker scores its slice of each eval
batch, worker 0 computes AUC and log loss over all of them."""

from __future__ import annotations

import numpy as np
import torch
from mpi4py import MPI

from cpu_dist.data import Dataset, eval_batches
from cpu_dist.models.dlrm import DLRM
from cpu_dist.models.embedding import ShardedEmbedding
from cpu_dist.models.scoring import evaluate


def evaluate_model(
    model: DLRM,
    embedding: ShardedEmbedding,
    dataset: Dataset,
    comm: MPI.Intracomm,
    *,
    batch_size: int,
    num_batches: int,
    dtype: torch.dtype,
) -> dict[str, float]:
    """``{"eval_auc", "eval_logloss"}`` on worker 0 (empty elsewhere).  The caller makes sure
    every commit it means to evaluate is applied first."""
    rank, world = comm.Get_rank(), comm.Get_size()
    scores, labels = [], []
    model.eval()
    with torch.no_grad():
        for batch in eval_batches(dataset, batch_size, num_batches):
            part = batch.shard(rank, world)
            keys = torch.from_numpy(part.keys)
            rows = torch.from_numpy(embedding.store.pull(embedding.unique_keys(keys)))
            logits = model(torch.from_numpy(part.dense).to(dtype), keys, rows=rows)
            scores.append(logits.double().numpy())
            labels.append(part.labels.astype(np.float64))
    model.train()
    s = np.concatenate(scores) if scores else np.zeros(0)
    y = np.concatenate(labels) if labels else np.zeros(0)
    gathered = comm.gather((s, y), root=0)
    if rank != 0 or gathered is None:
        return {}
    s = np.concatenate([g[0] for g in gathered])
    y = np.concatenate([g[1] for g in gathered])
    if not len(y):
        return {}
    return {f"eval_{k}": v for k, v in evaluate(s, y).items()}
