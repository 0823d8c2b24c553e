"""The one pooling function of every embedding bag collection, local or PS-backed.

A collection gathers each table's ids, deduplicates them, gets the unique ids' rows ``[u, d]``
from its row source (the local lazy store, or rows the step pipeline pulled from the parameter
server) and pools each feature's bags here.  Both kinds call this same function on the same
``(rows, index, offsets, weights, mode)``, so the single-process model and a job's forward
add the same floats in the same order and agree bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cpu_dist.common.tables import POOLINGS

__all__ = ["pool_bags"]


class _SumBags(torch.autograd.Function):
    """``F.embedding_bag(mode="sum")`` whose gradient for the rows is one ``index_add_`` of
    each value's bag gradient (times its weight).

    Autograd's own backward for the dense rows sorts the index on every call (per table, per
    step) before it adds; the rows here are already the table's unique ids, so scattering the
    ``[n, d]`` gradients straight into ``[u, d]`` gives the same sums at about half the cost
    (multi-hot DCN-v2, 26 tables: 29 -> 12 ms per step).  The weights get no gradient (they
    are data: nothing trains them), so this path is taken only where they do not require one.
    """

    @staticmethod
    def forward(ctx, rows, index, offsets, weights):
        ctx.save_for_backward(index, offsets, weights)
        ctx.num_rows = rows.shape[0]
        return F.embedding_bag(
            index, rows, offsets, mode="sum", per_sample_weights=weights, include_last_offset=True
        )

    @staticmethod
    def backward(ctx, grad):
        index, offsets, weights = ctx.saved_tensors
        start, end = int(offsets[0]), int(offsets[-1])  # the values the bags hold
        lengths = offsets[1:] - offsets[:-1]
        bag = torch.repeat_interleave(
            torch.arange(len(lengths), device=index.device), lengths, output_size=end - start
        )
        per_value = grad.index_select(0, bag)
        if weights is not None:
            per_value = per_value * weights[start:end].unsqueeze(1)
        rows = per_value.new_zeros((ctx.num_rows, grad.shape[1]))
        return rows.index_add_(0, index[start:end], per_value), None, None, None


def pool_bags(
    rows: torch.Tensor,
    index: torch.Tensor,
    offsets: torch.Tensor,
    weights: torch.Tensor | None,
    mode: str,
) -> torch.Tensor:
    """Pool bags of rows: ``[bags, d]``.

    Args:
        rows: ``[u, d]`` the rows of the table's unique ids (a leaf that requires grad while
            training: autograd sums each row's gradient over its uses).
        index: ``[n]`` int64, each value's row in ``rows``, bag after bag.
        offsets: ``[bags + 1]`` int64, bag ``b`` is ``index[offsets[b]:offsets[b + 1]]``.
        weights: ``[n]`` per-value weights, or None (all 1).
        mode: ``"sum"`` (``sum(w * row)``) or ``"mean"`` (that sum divided by the bag's
            length, FBGEMM's convention, weighted or not).  An empty bag pools to zeros.
            Where every bag holds one id the rows are looked up with ``F.embedding`` (the
            same values; its gradient sums in the order the one-hot embedding always has).

    Example::

        rows = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        pool_bags(rows, torch.tensor([0, 1, 1]), torch.tensor([0, 2, 2, 3]), None, "mean")
        # tensor([[0.5, 1.0], [0.0, 0.0], [0.0, 2.0]])
    """
    if mode not in POOLINGS:
        raise ValueError(f"pooling mode {mode!r}: must be one of {', '.join(POOLINGS)}")
    w = None if weights is None else weights.to(rows.dtype)
    if len(index) == len(offsets) - 1 and bool(((offsets[1:] - offsets[:-1]) == 1).all()):
        # One id per bag (a one-hot feature: Criteo's, the default DLRM's): sum and mean are
        # the row itself, looked up with the op the one-hot embedding has always used
        # (F.embedding), so such a model's forward and gradient bits stay what they were.
        looked = F.embedding(index, rows)
        return looked if w is None else looked * w.unsqueeze(1)
    if rows.requires_grad and torch.is_grad_enabled() and (w is None or not w.requires_grad):
        pooled = _SumBags.apply(rows, index, offsets, w)
    else:
        pooled = F.embedding_bag(
            index, rows, offsets, mode="sum", per_sample_weights=w, include_last_offset=True
        )
    if mode == "mean":
        lengths = (offsets[1:] - offsets[:-1]).clamp(min=1).to(rows.dtype)
        pooled = pooled / lengths.unsqueeze(1)
    return pooled
