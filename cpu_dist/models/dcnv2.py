"""DLRM-DCNv2, MLPerf's recommendation benchmark model, over an ``EmbeddingBagCollection``.

The shape is TorchRec's ``DLRM_DCN`` (the model of MLPerf's DLRM-DCNv2 reference):

- bottom MLP (TorchRec's ``DenseArch``): Linear+ReLU for every width of ``bot_mlp`` over the
  ``dense_features`` dense inputs;
- the embeddings: one :class:`~cpu_dist.embeddings.EmbeddingBagCollection` of the given tables,
  each feature pooled to its table's width (multi-hot bags, ``sum`` or ``mean``);
- interaction: a low-rank cross network (:class:`LowRankCrossNet`, TorchRec's name and
  parameter layout) over ``x0 = concat(bottom output, every pooled feature)``;
- top MLP (TorchRec's ``OverArch``): Linear+ReLU for every width but the last, which is 1 and
  has no activation: ``forward`` returns logits ``[B]`` for ``BCEWithLogitsLoss``.

Unlike TorchRec's ``DLRM_DCN``, which reshapes the features to ``[B, F, D]`` and so needs one
width for every table, the cross network here only ever sees the flat concatenation, so tables
of different widths (4, 16 and 64 in one model) need nothing: ``x0`` is ``bot_mlp[-1] + sum of
the features' widths`` wide, whatever they are.  MLPerf's configuration ends the bottom MLP in
the embedding width (``512-256-128`` over 128-wide tables); that is the default here too (the
tables' width, or the widest table's where they differ) but not a requirement.

There is no dropout and no batch normalisation: both make a step depend on how the global
batch is split over workers, and the framework's synchronous training is invariant in the
worker count only for models without them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from cpu_dist.embeddings import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from cpu_dist.models.layers import mlp

__all__ = ["DLRMDCNv2", "LowRankCrossNet", "dcnv2"]

# TorchRec's dlrm_main defaults (--dcn_num_layers, --dcn_low_rank_dim) and MLPerf's MLPs.
DEFAULT_NUM_LAYERS = 3
DEFAULT_LOW_RANK_DIM = 512
DEFAULT_BOT_MLP_HIDDEN = (512, 256)  # then the embedding width
DEFAULT_TOP_MLP = (1024, 1024, 512, 256, 1)


def _widths(name: str, widths: Sequence[int]) -> list[int]:
    if isinstance(widths, (str, bytes)) or not isinstance(widths, Sequence):
        raise ValueError(f"{name} {widths!r}: expected a list of layer widths")
    out = list(widths)
    if not out or not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in out):
        raise ValueError(f"{name} {out!r}: expected a non-empty list of positive integers")
    return out


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} {value!r}: must be a positive integer")
    return value


class LowRankCrossNet(nn.Module):
    """DCN-v2's cross network with low-rank weights: ``num_layers`` times
    ``x_{l+1} = x0 * (W_l (V_l x_l) + b_l) + x_l`` (``*`` elementwise).

    Each layer crosses every input column with a learned mix of all of them, so a model learns
    feature crosses explicitly instead of hoping an MLP finds them; ``W_l V_l`` (``[N, r]`` by
    ``[r, N]``) stands for DCN-v2's full ``[N, N]`` matrix at ``2 N r`` parameters.  Parameter
    names, shapes and init are TorchRec's: ``W_kernels.<l>`` ``[N, r]`` and ``V_kernels.<l>``
    ``[r, N]`` Xavier-normal, ``bias.<l>`` ``[N]`` zeros.

    Args:
        in_features: ``N``, the input's (and output's) width.
        num_layers: the number of cross layers (TorchRec's ``dcn_num_layers``, default 3).
        low_rank: ``r`` (TorchRec's ``dcn_low_rank_dim``, default 512); any ``r >= 1``, also
            one above ``N`` (then it costs more than a full-rank layer, as in TorchRec).

    Example::

        cross = LowRankCrossNet(in_features=24, num_layers=2, low_rank=8)
        y = cross(torch.rand(5, 24))   # [5, 24]
    """

    def __init__(
        self,
        in_features: int,
        num_layers: int = DEFAULT_NUM_LAYERS,
        low_rank: int = DEFAULT_LOW_RANK_DIM,
    ) -> None:
        super().__init__()
        n = _positive_int("in_features", in_features)
        r = _positive_int("low_rank_dim", low_rank)
        layers = _positive_int("num_layers", num_layers)
        self.in_features, self.num_layers, self.low_rank = n, layers, r
        self.W_kernels = nn.ParameterList(
            [nn.Parameter(nn.init.xavier_normal_(torch.empty(n, r))) for _ in range(layers)]
        )
        self.V_kernels = nn.ParameterList(
            [nn.Parameter(nn.init.xavier_normal_(torch.empty(r, n))) for _ in range(layers)]
        )
        self.bias = nn.ParameterList([nn.Parameter(torch.zeros(n)) for _ in range(layers)])

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        """``[B, N] -> [B, N]``."""
        x = x0
        for w, v, b in zip(self.W_kernels, self.V_kernels, self.bias):
            x = x0 * (nn.functional.linear(nn.functional.linear(x, v), w) + b) + x
        return x

    def extra_repr(self) -> str:
        n, layers, r = self.in_features, self.num_layers, self.low_rank
        return f"in_features={n}, num_layers={layers}, low_rank={r}"


class DLRMDCNv2(nn.Module):
    """DLRM-DCNv2: ``forward(dense [B, dense_features], sparse: KeyedJaggedTensor) -> [B]``
    logits (see the module docstring for the shape and why mixed table widths are fine).

    Dense parameters: ``bot.*``, ``crossnet.*``, ``top.*``; the rows live in
    ``sparse_arch`` (an :class:`EmbeddingBagCollection`, local and lazy outside a job, the
    parameter server's inside one) and are not ``parameters()``.  Building the collection
    draws no torch random numbers, so the dense init under ``torch.manual_seed(s)`` depends
    only on ``s``, the widths and the layer counts.

    Args:
        tables: the embedding tables (each feature in one table; features may share one).
        dense_features: the number of dense inputs per sample.
        bot_mlp: the bottom MLP's widths; default MLPerf's ``[512, 256, D]``, ``D`` the
            tables' width (the widest where they differ).
        top_mlp: the top MLP's widths, ending in 1; default MLPerf's
            ``[1024, 1024, 512, 256, 1]``.
        num_layers: the cross network's layers (``--dcn-num-layers``, default 3).
        low_rank_dim: its rank (``--dcn-low-rank-dim``, default 512).
        seed: ``row_init``'s seed of the tables whose config has none (a job's ``--seed``).

    Example::

        tables = [EmbeddingBagConfig(0, 16, f"t_{f}", feature_names=[f]) for f in ("a", "b")]
        model = DLRMDCNv2(tables, dense_features=13, bot_mlp=[64, 16], top_mlp=[32, 1],
                          num_layers=2, low_rank_dim=8)
        logits = model(dense, kjt)       # [B]
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        dense_features: int,
        bot_mlp: Sequence[int] | None = None,
        top_mlp: Sequence[int] = DEFAULT_TOP_MLP,
        num_layers: int = DEFAULT_NUM_LAYERS,
        low_rank_dim: int = DEFAULT_LOW_RANK_DIM,
        *,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.dense_features = _positive_int("dense_features", dense_features)
        # The collection first: it draws no torch random numbers (its rows are lazy), so the
        # dense layers below take the same draws whatever the tables are.
        self.sparse_arch = EmbeddingBagCollection(tables, seed=seed)
        configs = self.sparse_arch.embedding_bag_configs()
        if bot_mlp is None:
            bot_mlp = [*DEFAULT_BOT_MLP_HIDDEN, max(c.embedding_dim for c in configs)]
        bot = _widths("bot_mlp", bot_mlp)
        top = _widths("top_mlp", top_mlp)
        if top[-1] != 1:
            raise ValueError(f"top_mlp {top!r}: the last width must be 1 (one logit per sample)")
        pooled = sum(c.embedding_dim * c.num_features() for c in configs)
        self.bot = mlp(self.dense_features, bot, last_activation=True)
        self.crossnet = LowRankCrossNet(bot[-1] + pooled, num_layers, low_rank_dim)
        self.top = mlp(bot[-1] + pooled, top, last_activation=False)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        """Logits ``[B]``.

        Args:
            dense: ``[B, dense_features]`` floats.
            sparse: the batch's ids, key-major, ``stride() == B`` (extra keys are ignored).

        The dense layers compute in their own dtype (``model.double()`` for a float64 run);
        the pooled float32 rows are cast to it, and their gradients back.
        """
        dense = torch.as_tensor(dense)
        if dense.dim() != 2 or dense.shape[1] != self.dense_features:
            raise ValueError(
                f"dense {tuple(dense.shape)}: expected [B, {self.dense_features}] (the model's "
                "dense_features)"
            )
        first: nn.Linear = self.bot[0]  # type: ignore[assignment]
        dtype = first.weight.dtype
        bottom = self.bot(dense.to(dtype))
        pooled = self.sparse_arch(sparse).values()
        if pooled.shape[0] != bottom.shape[0]:
            raise ValueError(
                f"the sparse features hold {pooled.shape[0]} samples, dense {bottom.shape[0]}"
            )
        x0 = torch.cat([bottom, pooled.to(dtype)], dim=1)
        return self.top(self.crossnet(x0)).squeeze(-1)


def dcnv2(
    tables: list[EmbeddingBagConfig],
    dense_features: int,
    *,
    bot_mlp: Sequence[int] | None = None,
    top_mlp: Sequence[int] = DEFAULT_TOP_MLP,
    num_layers: int = DEFAULT_NUM_LAYERS,
    low_rank_dim: int = DEFAULT_LOW_RANK_DIM,
    seed: int = 0,
) -> DLRMDCNv2:
    """The built-in ``dcnv2`` model, with the user-model factory's signature
    ``FUNC(tables, dense_features, **args)`` (``cpu_dist.models.factory``), so the built-in
    and a user's model are built the same way.  Its arguments are :class:`DLRMDCNv2`'s.

    Example::

        model = dcnv2(tables, 13, bot_mlp=[64, 16], top_mlp=[32, 1], low_rank_dim=8)
    """
    return DLRMDCNv2(
        tables,
        dense_features,
        bot_mlp=bot_mlp,
        top_mlp=top_mlp,
        num_layers=num_layers,
        low_rank_dim=low_rank_dim,
        seed=seed,
    )
