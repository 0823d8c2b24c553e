"""A user's own model, as a user writes one: a two-tower recommender over multi-hot features.

Nothing here is the framework's but the embeddings API (TorchRec's names): the model is a
plain ``nn.Module`` that owns two ``EmbeddingBagCollection``s, one per tower, and its
``forward(dense, sparse)`` takes the dense inputs and a ``KeyedJaggedTensor`` and returns
logits.  Written this way it trains in one process as it is (``sparse_step`` for the rows,
any torch optimizer for the rest), and a job trains the same module on many workers, with
every collection it owns distributed and the rest dense (``--model
cpu_dist/examples/user_model.py:two_tower``, issue 25's job wiring).

- user tower: the user-side features (a user's last clicked items, multi-hot, and whatever
  else) pooled, concatenated with the dense inputs, through an MLP;
- item tower: the candidate's features pooled, through an MLP of the same output width;
- logit: the towers' dot product plus a learned bias.

No dropout and no batch norm: with either, a step depends on how the global batch is split
over the workers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from cpu_dist.embeddings import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

__all__ = ["TwoTower", "two_tower"]


def _mlp(in_size: int, widths: Sequence[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, w in enumerate(widths):
        layers.append(nn.Linear(in_size, w))
        if i < len(widths) - 1:
            layers.append(nn.ReLU())
        in_size = w
    return nn.Sequential(*layers)


class TwoTower(nn.Module):
    """Two towers, a dot product: ``forward(dense [B, dense_features], sparse) -> [B]``.

    Args:
        user_tables: the user tower's tables (its collection ``user.embeddings``).
        item_tables: the item tower's tables (``item.embeddings``).
        dense_features: dense inputs per sample; they join the user tower (0: none).
        tower_mlp: both towers' MLP widths; the last is the width of the dot product.

    Example::

        model = TwoTower(user_tables, item_tables, dense_features=2, tower_mlp=[32, 8])
        logits = model(dense, kjt)
    """

    def __init__(
        self,
        user_tables: Sequence[EmbeddingBagConfig],
        item_tables: Sequence[EmbeddingBagConfig],
        dense_features: int,
        tower_mlp: Sequence[int] = (64, 16),
    ) -> None:
        super().__init__()
        self.user = nn.ModuleDict({"embeddings": EmbeddingBagCollection(user_tables)})
        self.item = nn.ModuleDict({"embeddings": EmbeddingBagCollection(item_tables)})

        def width(tables: Sequence[EmbeddingBagConfig]) -> int:
            return sum(t.embedding_dim * len(t.feature_names) for t in tables)

        self.dense_features = dense_features
        self.user["mlp"] = _mlp(width(user_tables) + dense_features, tower_mlp)
        self.item["mlp"] = _mlp(width(item_tables), tower_mlp)
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        """Logits ``[B]``: the user and item vectors' dot product plus the bias.  The towers
        compute in the parameters' dtype (the rows are float32; a float64 job casts them)."""
        dtype = self.bias.dtype
        user_in = self.user["embeddings"](sparse).values().to(dtype)
        if self.dense_features:
            user_in = torch.cat([user_in, dense.to(dtype)], dim=1)
        u = self.user["mlp"](user_in)
        v = self.item["mlp"](self.item["embeddings"](sparse).values().to(dtype))
        return (u * v).sum(1) + self.bias


def two_tower(
    tables: list[EmbeddingBagConfig],
    dense_features: int,
    *,
    item_tables: Sequence[str] | None = None,
    tower_mlp: Sequence[int] = (64, 16),
) -> TwoTower:
    """The factory a job calls (``--model cpu_dist/examples/user_model.py:two_tower``):
    ``FUNC(tables, dense_features, **args)``, ``args`` from the job file's ``[model]`` keys.

    Args:
        tables: the job's tables.
        dense_features: dense inputs per sample (they join the user tower).
        item_tables: the names of the item tower's tables; default: the last table.
        tower_mlp: both towers' MLP widths.

    Example::

        model = two_tower(tables, 2, item_tables=["items"], tower_mlp=[32, 8])
    """
    if len(tables) < 2:
        raise ValueError(
            f"two_tower needs >= 2 tables (a user and an item side), got {len(tables)}"
        )
    names = [t.name for t in tables]
    chosen = list(item_tables) if item_tables is not None else [names[-1]]
    unknown = [n for n in chosen if n not in names]
    if unknown:
        raise ValueError(f"item_tables: {unknown[0]!r} is not a table (tables: {', '.join(names)})")
    item = [t for t in tables if t.name in chosen]
    user = [t for t in tables if t.name not in chosen]
    if not item or not user:
        raise ValueError("item_tables: each tower needs at least one table")
    return TwoTower(user, item, dense_features, tower_mlp)
