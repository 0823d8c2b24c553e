"""DLRM over an ``EmbeddingBagCollection``: bottom MLP over dense features, pooled embeddings,
dot interaction, top MLP -> logits.

The structure follows the DLRM paper and reference implementation.  The MLP flags list layer
widths (``--arch-mlp-bot 512-256-64``, ``--arch-mlp-top 512-256-1``); unlike DLRM's reference,
the bottom MLP's input width (the dense features) is not written:

- bottom MLP: Linear+ReLU for every width in ``bot_mlp``; its last width ``d`` is the
  interaction's width, since its output is one more vector in the interaction;
- embeddings: one :class:`~cpu_dist.embeddings.EmbeddingBagCollection` of the job's tables,
  every feature pooled to its table's width (one-hot features: the row itself);
- interaction: the pairwise dot products of the F+1 vectors (bottom output and the F pooled
  features, in the collection's output order), strictly upper triangle of the (F+1)x(F+1)
  Gram matrix, concatenated after the bottom output;
- top MLP: Linear layers with ReLU between them and none after the last, which has width 1:
  the forward returns logits ``[B]`` for ``BCEWithLogitsLoss``.

Features whose table is narrower or wider than ``d`` go through a linear projection
``proj.<i>`` (no bias; ``i`` the feature's place in the collection's output) to ``d`` before
the interaction; with one width there is none.  Dense parameters are ``bot.*``, ``top.*`` and
``proj.*``; the rows are not parameters (the collection's row source holds them).  The
built-in ``dlrm`` (:func:`dlrm`, the factory signature of ``cpu_dist.models.factory``) is the
default model of a job: its parameters, their seeded init and, for the default job's one
fused table, its forward and gradient bits are those of the DLRM this project always trained.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from cpu_dist.embeddings import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from cpu_dist.models.layers import mlp

__all__ = ["DLRM", "dlrm"]


class DLRM(nn.Module):
    """See the module docstring. ``forward(dense [B, dense_features], sparse) -> logits [B]``.

    Args:
        tables: the embedding tables (each feature in one table; features may share one).
        dense_features: the number of dense inputs per sample.
        bot_mlp: the bottom MLP's widths; the last is the interaction's width.
        top_mlp: the top MLP's widths; the last must be 1.
        seed: ``row_init``'s seed for tables whose config has none.

    Example::

        model = DLRM(tables, 13, bot_mlp=[64, 16], top_mlp=[32, 1])
        logits = model(dense, kjt)
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        dense_features: int,
        bot_mlp: Sequence[int],
        top_mlp: Sequence[int],
        *,
        seed: int = 0,
    ) -> None:
        super().__init__()
        bot_mlp, top_mlp = list(bot_mlp), list(top_mlp)
        if not bot_mlp or min(bot_mlp) <= 0:
            raise ValueError(f"bot_mlp {bot_mlp}: need at least one positive width")
        if not top_mlp or top_mlp[-1] != 1:
            raise ValueError(
                f"the top MLP's last width must be 1 (one logit per sample), got top_mlp={top_mlp}"
            )
        if dense_features <= 0:
            raise ValueError(f"need dense_features > 0, got {dense_features}")
        # The collection first: it draws no torch random numbers, so bot and top take the
        # same seeded draws whatever the tables are.
        self.embedding = EmbeddingBagCollection(tables, seed=seed)
        widths = [c.embedding_dim for c in tables for _ in c.feature_names]
        dim = bot_mlp[-1]
        self.num_dense, self.num_sparse, self.dim = dense_features, len(widths), dim
        self.bot = mlp(dense_features, bot_mlp, last_activation=True)
        n = self.num_sparse + 1
        self._triu: torch.Tensor
        self.register_buffer("_triu", torch.triu_indices(n, n, offset=1), persistent=False)
        self.top = mlp(dim + n * (n - 1) // 2, top_mlp, last_activation=False)
        # After bot and top, so that their seeded init does not depend on the projections.
        self.proj = nn.ModuleDict(
            {str(i): nn.Linear(w, dim, bias=False) for i, w in enumerate(widths) if w != dim}
        )
        self._widths = widths

    def interact(self, bottom: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """``[B, d]``, ``[B, F, d]`` -> ``[B, d + (F+1)F/2]``: bottom output, then the dots."""
        t = torch.cat([bottom.unsqueeze(1), emb], dim=1)
        gram = torch.bmm(t, t.transpose(1, 2))
        return torch.cat([bottom, gram[:, self._triu[0], self._triu[1]]], dim=1)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        """Logits ``[B]``.  The dense layers compute in their own dtype (``model.double()``
        for a float64 run); the pooled float32 rows are cast to it, and their gradients back.
        """
        first: nn.Linear = self.bot[0]  # type: ignore[assignment]
        dtype = first.weight.dtype
        bottom = self.bot(torch.as_tensor(dense).to(dtype))
        pooled = self.embedding(sparse).values()
        b = pooled.shape[0]
        if not self.proj:
            emb = pooled.view(b, self.num_sparse, self.dim)
        else:  # features of several widths: project each to the interaction's width
            parts = torch.split(pooled, self._widths, dim=1)
            emb = torch.stack(
                [
                    self.proj[str(i)](p.to(dtype)) if str(i) in self.proj else p.to(dtype)
                    for i, p in enumerate(parts)
                ],
                dim=1,
            )
        if emb.dtype != dtype:
            emb = emb.to(dtype)
        return self.top(self.interact(bottom, emb)).squeeze(-1)


def dlrm(
    tables: list[EmbeddingBagConfig],
    dense_features: int,
    *,
    bot_mlp: Sequence[int],
    top_mlp: Sequence[int],
    seed: int = 0,
) -> DLRM:
    """The built-in ``dlrm`` model, with the user-model factory's signature
    ``FUNC(tables, dense_features, **args)``; a job passes ``--arch-mlp-bot`` and
    ``--arch-mlp-top`` as ``bot_mlp`` and ``top_mlp`` (a job file's ``[model]`` keys
    override them).

    Example::

        model = dlrm(tables, 13, bot_mlp=[512, 256, 64], top_mlp=[512, 256, 1])
    """
    return DLRM(tables, dense_features, bot_mlp, top_mlp, seed=seed)
