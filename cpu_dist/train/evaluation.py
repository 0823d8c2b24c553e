"""Held-out evaluation of the distributed model: every worker scores its slice of each held-out
batch (the eval split during training, the test split at the end); worker 0 puts the slices
back in the data's order and computes every figure over all of them (``models.scoring``: AUC,
log loss, NE, calibration, CTR; and each ``--metric``), so that any number of workers reports
the same figures for the same scores."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import torch
from mpi4py import MPI
from torch import nn

from cpu_dist.common.mpi_context import wait_all
from cpu_dist.data import Batch
from cpu_dist.embeddings import KeyedJaggedTensor
from cpu_dist.models.outputs import logits_of
from cpu_dist.models.scoring import evaluate, probabilities
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
    user_metrics: Sequence[Callable[[np.ndarray, np.ndarray], float]] = (),
    user_keys: Sequence[str] = (),
) -> dict[str, float]:
    """``{"<prefix>_auc", "_logloss", "_ne", "_calibration", "_ctr", "_samples"}`` and
    ``<prefix>_<key>`` of each of ``user_metrics`` (called with every row's probability and
    label) on worker 0 (empty elsewhere, and when there were no batches). Every worker walks
    the same global ``batches`` (of any size: ``share`` cuts each). The caller makes sure
    every commit it means to evaluate is applied first; ``plan`` makes a batch's features
    and each table's plan (the training's own), ``read_rows`` reads float32 rows of every
    table's unique ids as the PS holds them (never through a lossy wire encoding), and they
    are bound to the model's collections through ``rows`` as in training. The workers meet
    in a sleeping barrier (``timeout_s``) before the scores are gathered: worker 0 may still
    be scoring the split before (importing torchmetrics the first time), and a blocking
    gather would spin the others' cores meanwhile. ``model_name`` names the model where its
    output is not logits ``[B]`` or ``[B, 1]`` (:func:`~cpu_dist.models.outputs.logits_of`)."""
    rank, world = comm.Get_rank(), comm.Get_size()
    scores, labels = [], []  # one entry per batch, empty where this worker's share is
    model.eval()
    with torch.no_grad():
        for batch in batches:
            part = share(batch, rank, world)
            if not len(part):
                scores.append(np.zeros(0))
                labels.append(np.zeros(0))
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
    wait_all(comm, timeout_s, f"{prefix} evaluation")
    gathered = comm.gather((scores, labels), root=0)
    if rank != 0 or gathered is None:
        return {}
    s, y = in_data_order([g[0] for g in gathered]), in_data_order([g[1] for g in gathered])
    if not len(y):
        return {}
    result = {f"{prefix}_{k}": v for k, v in evaluate(s, y).items()}
    result[f"{prefix}_samples"] = len(y)  # what the figures are over
    p = probabilities(s)
    for key, metric in zip(user_keys, user_metrics, strict=True):
        result[f"{prefix}_{key}"] = metric(p, y)
    return result


def in_data_order(per_worker: Sequence[Sequence[np.ndarray]]) -> np.ndarray:
    """Every worker's per-batch slices (worker r's list: its slice of each batch) as one
    array in the data's order: batch by batch, each batch's slices in rank order (``share``
    cuts contiguous slices), the rows a single process would score in that order."""
    parts = [piece for pieces in zip(*per_worker) for piece in pieces]
    return np.concatenate(parts) if parts else np.zeros(0)
