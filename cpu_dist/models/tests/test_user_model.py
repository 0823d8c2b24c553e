"""The worked user model (``cpu_dist/examples/user_model.py``): loaded by the factory from its
file, as a job will, it trains in one process on multi-hot features, torch.optim for the dense
part and ``sparse_step`` for the rows, and learns a synthetic signal."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from cpu_dist.embeddings import EmbeddingBagConfig, KeyedJaggedTensor, collections_of, sparse_step
from cpu_dist.models.factory import ModelError, build_model

pytestmark = pytest.mark.timeout(60)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "user_model.py"
SPEC = f"{EXAMPLE}:two_tower"
IDS = 10  # item ids per taste
TABLES = [
    # a user's last clicked items: multi-hot, mean-pooled, raw ids
    EmbeddingBagConfig(0, 8, "history", feature_names=["clicked"], pooling="mean", lr=0.5),
    EmbeddingBagConfig(0, 4, "candidates", feature_names=["item"], lr=0.5),
]


def batch(n: int, seed: int) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    """Users of two tastes: a user clicked 1..5 items of its taste's id range (0..9 or
    10..19); the label is whether the candidate item is of the user's taste, so the signal is
    in the rows: only the embeddings can tell the ranges apart."""
    g = torch.Generator().manual_seed(seed)
    taste = torch.randint(0, 2, (n,), generator=g)
    lengths = torch.randint(1, 6, (n,), generator=g)
    clicked = torch.cat(
        [
            torch.randint(0, IDS, (int(k),), generator=g) + IDS * int(t)
            for k, t in zip(lengths, taste)
        ]
    )
    item_taste = torch.randint(0, 2, (n,), generator=g)
    item = torch.randint(0, IDS, (n,), generator=g) + IDS * item_taste
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["clicked", "item"],
        torch.cat([clicked, item]),
        torch.cat([lengths, torch.ones(n, dtype=torch.int64)]),
    )
    dense = torch.rand(n, 2, generator=g)  # noise
    return dense, kjt, (taste == item_taste).float()


def test_the_example_loads_from_its_file_and_owns_one_collection_per_tower():
    model = build_model(SPEC, TABLES, 2, {"tower_mlp": [16, 8]}, seed=0)
    assert [n for n, _ in collections_of(model)] == ["user.embeddings", "item.embeddings"]
    assert not {nn.Dropout, nn.BatchNorm1d} & {type(m) for m in model.modules()}
    with pytest.raises(ModelError, match=r"item_tables: 'nope' is not a table"):
        build_model(SPEC, TABLES, 2, {"item_tables": ["nope"]})


def test_it_trains_locally_and_the_loss_falls_on_a_learnable_signal():
    model = build_model(SPEC, TABLES, 2, {"tower_mlp": [16, 8]}, seed=0)
    dense, kjt, labels = batch(256, seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    loss_fn = nn.BCEWithLogitsLoss()
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = loss_fn(model(dense, kjt), labels)
        loss.backward()
        opt.step()
        updated = sparse_step(model)
        losses.append(loss.item())
    # every id's row was trained (each batch touches all 2 * IDS of both tables)
    assert updated == {
        "user.embeddings": {"history": 2 * IDS},
        "item.embeddings": {"candidates": 2 * IDS},
    }
    # chance is log 2 = 0.693; a fresh batch from the same users' world scores well too
    assert losses[0] > 0.6 and losses[-1] < 0.2 * losses[0], losses
    with torch.no_grad():
        d, k, y = batch(256, seed=2)
        held_out = loss_fn(model(d, k), y).item()
    assert held_out < 0.3 * losses[0], (held_out, losses[-1])


def test_a_float64_model_casts_the_float32_rows():
    model = build_model(SPEC, TABLES, 2, {"tower_mlp": [4]}, seed=0).double()
    dense, kjt, _ = batch(8, seed=3)
    logits = model(dense, kjt)
    assert logits.dtype == torch.float64 and logits.shape == (8,)
    logits.sum().backward()
    assert sparse_step(model)["item.embeddings"]["candidates"] > 0
