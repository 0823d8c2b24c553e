"""DLRM: bottom MLP over dense features, embeddings, dot interaction, top MLP -> logits.

The structure follows the DLRM paper and reference implementation.  The MLP flags list layer
widths (``--arch-mlp-bot 512-256-64``, ``--arch-mlp-top 512-256-1``); unlike DLRM's reference,
the bottom MLP's input width (the 13 dense features) is not written:

- bottom MLP: Linear+ReLU for every width in ``bot_mlp``; the last width must equal the
  embedding dimension, since its output is one more vector in the interaction;
- interaction: the pairwise dot products of the F+1 vectors (bottom output and the F
  embeddings), strictly upper triangle of the (F+1)x(F+1) Gram matrix, concatenated after the
  bottom output;
- top MLP: Linear layers with ReLU between them and none after the last, which has width 1:
  the forward returns logits ``[B]`` for ``BCEWithLogitsLoss``.

The embedding is any module mapping keys ``[B, F]`` to ``[B, F, dim]``, so the same DLRM runs
over the parameter server (:class:`ShardedEmbedding`) or a local ``nn.EmbeddingBag``. Dense
parameters are ``bot.*`` and ``top.*``; :meth:`DLRM.dense_named_parameters` leaves out any
parameters the embedding module has, since those are sparse state, not dense.

Features of different widths (a job whose tables differ in ``dim``): the embedding yields a
tuple of ``[B, d_f]`` vectors (``TableEmbedding``) and ``feature_dims`` names each feature's
width; a feature narrower or wider than ``dim`` goes through a linear projection
``proj.<f>`` (no bias) to ``dim`` before the interaction.  This is the stop-gap model for
mixed widths until the models issue brings user models; with one width there is no
projection and the parameters (and their seeded init) are today's.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence

import torch
from torch import nn

from cpu_dist.models.layers import mlp


class DLRM(nn.Module):
    """See the module docstring. ``forward(dense [B, num_dense], keys [B, num_sparse])``."""

    def __init__(
        self,
        embedding: nn.Module,
        num_dense: int,
        num_sparse: int,
        dim: int,
        bot_mlp: Sequence[int],
        top_mlp: Sequence[int],
        feature_dims: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        bot_mlp, top_mlp = list(bot_mlp), list(top_mlp)
        if not bot_mlp or bot_mlp[-1] != dim:
            raise ValueError(
                f"the bottom MLP's last width must equal the embedding dim {dim} (it joins the "
                f"interaction as one more vector), got bot_mlp={bot_mlp}"
            )
        if not top_mlp:
            raise ValueError("top_mlp must have at least one width (the final one is 1)")
        if top_mlp[-1] != 1:
            raise ValueError(
                f"the top MLP's last width must be 1 (one logit per sample), got top_mlp={top_mlp}"
            )
        if num_dense <= 0 or num_sparse <= 0:
            raise ValueError(
                f"need num_dense > 0 and num_sparse > 0, got {num_dense}, {num_sparse}"
            )
        self.num_dense, self.num_sparse, self.dim = num_dense, num_sparse, dim
        self.embedding = embedding
        self.bot = mlp(num_dense, bot_mlp, last_activation=True)
        n = num_sparse + 1
        self._triu: torch.Tensor
        self.register_buffer("_triu", torch.triu_indices(n, n, offset=1), persistent=False)
        self.top = mlp(dim + n * (n - 1) // 2, top_mlp, last_activation=False)
        self._embedding_takes_rows = "rows" in inspect.signature(embedding.forward).parameters
        widths = list(feature_dims) if feature_dims is not None else [dim] * num_sparse
        if len(widths) != num_sparse or min(widths) <= 0:
            raise ValueError(f"feature_dims {widths}: need {num_sparse} positive widths")
        # After bot and top, so that their seeded init does not depend on the projections.
        self.proj = nn.ModuleDict(
            {str(f): nn.Linear(w, dim, bias=False) for f, w in enumerate(widths) if w != dim}
        )

    def interact(self, bottom: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """``[B, d]``, ``[B, F, d]`` -> ``[B, d + (F+1)F/2]``: bottom output, then the dots."""
        t = torch.cat([bottom.unsqueeze(1), emb], dim=1)
        gram = torch.bmm(t, t.transpose(1, 2))
        return torch.cat([bottom, gram[:, self._triu[0], self._triu[1]]], dim=1)

    def forward(
        self,
        dense: torch.Tensor,
        keys: torch.Tensor | Mapping[str, torch.Tensor],
        rows: torch.Tensor | Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Logits ``[B]``. ``keys`` and ``rows`` (pre-pulled rows of the unique keys) are the
        embedding's: fused keys, or per table (``TableEmbedding``)."""
        first: nn.Linear = self.bot[0]  # type: ignore[assignment]
        dtype = first.weight.dtype
        bottom = self.bot(torch.as_tensor(dense).to(dtype))
        if rows is not None:
            if not self._embedding_takes_rows:
                raise TypeError(f"{type(self.embedding).__name__}.forward takes no rows argument")
            emb = self.embedding(keys, rows=rows)
        else:
            emb = self.embedding(keys)
        if isinstance(emb, (tuple, list)):  # features of several widths: project to dim
            emb = torch.stack([self._project(f, e.to(dtype)) for f, e in enumerate(emb)], dim=1)
        if emb.dtype != dtype:
            emb = emb.to(dtype)
        return self.top(self.interact(bottom, emb)).squeeze(-1)

    def _project(self, f: int, e: torch.Tensor) -> torch.Tensor:
        proj = self.proj[str(f)] if str(f) in self.proj else None
        if proj is None:
            if e.shape[-1] != self.dim:
                raise ValueError(f"feature {f} has width {e.shape[-1]}, the model expects it")
            return e
        return proj(e)

    def dense_named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """The dense parameters with stable names (``bot.0.weight`` ...), embedding excluded."""
        for name, p in self.named_parameters():
            if not name.startswith("embedding."):
                yield name, p

    def dense_parameters(self) -> list[nn.Parameter]:
        return [p for _, p in self.dense_named_parameters()]


def build_dlrm(
    embedding: nn.Module,
    *,
    dim: int,
    num_dense: int = 13,
    num_sparse: int = 26,
    bot_mlp: Sequence[int],
    top_mlp: Sequence[int],
    seed: int,
    dtype: torch.dtype = torch.float32,
    feature_dims: Sequence[int] | None = None,
) -> DLRM:
    """The one way the trainer and the reference build a DLRM, so their dense init is equal.

    Dense parameters take torch's default init drawn under ``torch.manual_seed(seed)``; the
    caller's global RNG state is restored afterwards. The embedding is built by the caller
    (outside this RNG scope) and, if it has a ``dtype`` attribute (ShardedEmbedding), that is
    set to ``dtype`` as well.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DLRM(embedding, num_dense, num_sparse, dim, bot_mlp, top_mlp, feature_dims)
    model.to(dtype)
    if isinstance(getattr(embedding, "dtype", None), torch.dtype):
        setattr(embedding, "dtype", dtype)  # noqa: B010 - a plain attribute, not a Module
    return model
