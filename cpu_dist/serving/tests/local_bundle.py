"""A bundle of a model trained locally (its collections' own rows), written as an export
writes one: what the serving tests load and score without a parameter server."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from cpu_dist.embeddings import EmbeddingBagConfig, collections_of, sparse_step
from cpu_dist.serving.bundle import BundleWriter, DataSpec, TableInfo
from cpu_dist.serving.model_record import ModelRecord, table_record


def train_locally(
    model: nn.Module, features: Callable[[object], object], batches: Iterable, lr: float
) -> None:
    """SGD steps on ``batches`` (the data's own Batch objects), dense layers and the
    collections' local rows alike, then ``model.eval()``: a model whose rows and weights
    both differ from their initial values, as a job's would."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for batch in batches:
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(torch.from_numpy(batch.dense), features(batch)),
            torch.from_numpy(batch.labels.astype(np.float32)),
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        sparse_step(model)
    model.eval()


def write_local(
    model: nn.Module,
    tables: list[EmbeddingBagConfig],
    record: ModelRecord,
    out: Path,
    data: DataSpec | None = None,
) -> Path:
    """The bundle of a locally trained model, as an export writes one: its tables' held rows,
    its dense state without them, its record."""
    held: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    prefixes = []
    for name, ebc in collections_of(model):
        held.update(ebc.table_rows())
        prefixes.append(f"{name}.embedding_bags.")
    dense = {
        k: v.detach().clone()
        for k, v in model.state_dict().items()
        if not k.startswith(tuple(prefixes))
    }
    infos = [
        TableInfo(c.name, c.embedding_dim, len(held[c.name][0]), table_record(c, record.seed))
        for c in tables
    ]
    writer = BundleWriter(out, infos)
    for c in tables:
        writer.add(c.name, *held[c.name])
    writer.finish(record, dense, 3, data)
    return out
