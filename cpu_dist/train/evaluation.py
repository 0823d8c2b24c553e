"""Held-out evaluation of the distributed model: every worker scores its slice of each held-out
batch (the eval split during training, the test split at the end), worker 0 computes AUC and
log loss over all of them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np
import torch
from mpi4py import MPI
from torch import nn

from cpu_dist.common.mpi_context import wait_all
from cpu_dist.data import Batch
from cpu_dist.embeddings import KeyedJaggedTensor
from cpu_dist.models.outputs import logits_of
from cpu_dist.models.scoring import evaluate
from cpu_dist.train.step_rows import Plans, StepRows


def share(batch: Batch, rank: int, world: int) -> Batch:
    """Worker ``rank``'s contiguous part of a held-out batch of any size (a last partial batch
    need not divide by W); the parts in rank order are the batch."""
    b = len(batch)
    return batch.rows(rank * b // world, (rank + 1) * b // world)  # bags too


def evaluate_model(
    model: nn.Module,
    batches: Iterable[Batch],
    comm: MPI.Intracomm,
    *,
    dtype: torch.dtype,
    plan: Callable[[Batch], tuple[KeyedJaggedTensor, Plans]],
    rows: StepRows,
    read_rows: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]],
    prefix: str = "eval",
    timeout_s: float,
    model_name: str = "the model",
) -> dict[str, float]:
    """``{"<prefix>_auc", "<prefix>_logloss", "<prefix>_samples"}`` on worker 0 (empty
    elsewhere, and when there were no batches).  Every worker walks the same global
    ``batches`` (of any size: ``share`` cuts each).  The caller makes sure every commit it
    means to evaluate is applied first; ``plan`` makes a batch's features and each table's
    plan (the training's own), ``read_rows`` reads float32 rows of every table's unique ids
    as the PS holds them (never through a lossy wire encoding), and they are bound to the
    model's collections through ``rows`` as in training.  The workers meet in a sleeping
    barrier (``timeout_s``) before the scores are gathered: worker 0 may still be scoring the
    split before (importing scikit-learn the first time), and a blocking gather would spin
    the others' cores meanwhile.  ``model_name`` names the model where its output is not
    logits ``[B]`` or ``[B, 1]`` (:func:`~cpu_dist.models.outputs.logits_of`)."""
    rank, world = comm.Get_rank(), comm.Get_size()
    scores, labels = [], []
    model.eval()
    with torch.no_grad():
        for batch in batches:
            part = share(batch, rank, world)
            if not len(part):
                continue
            kjt, plans = plan(part)
            pulled = read_rows({name: p[0] for name, p in plans.items()})
            rows.bind(plans, {n: torch.from_numpy(np.asarray(r)) for n, r in pulled.items()})
            logits = logits_of(
                model(torch.from_numpy(part.dense).to(dtype), kjt), len(part), model_name
            )
            scores.append(logits.double().numpy())
            labels.append(part.labels.astype(np.float64))
    model.train()
    s = np.concatenate(scores) if scores else np.zeros(0)
    y = np.concatenate(labels) if labels else np.zeros(0)
    wait_all(comm, timeout_s, f"{prefix} evaluation")
    gathered = comm.gather((s, y), root=0)
    if rank != 0 or gathered is None:
        return {}
    s = np.concatenate([g[0] for g in gathered])
    y = np.concatenate([g[1] for g in gathered])
    if not len(y):
        return {}
    result = {f"{prefix}_{k}": v for k, v in evaluate(s, y).items()}
    result[f"{prefix}_samples"] = len(y)  # what the figures are over
    return result
