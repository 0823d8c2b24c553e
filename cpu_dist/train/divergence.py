"""What a diverged step says (``NonFiniteLoss``'s message): the dense side and the sparse side
of the step whose loss is not finite, and what to lower."""

from __future__ import annotations

import torch
from torch import nn

from cpu_dist.common.config import TrainConfig
from cpu_dist.train.step_rows import dense_named_parameters


def why_not_finite(
    model: nn.Module,
    t: TrainConfig,
    rank: int,
    step: int,
    loss: float,
    rows: dict[str, torch.Tensor],
    inputs: torch.Tensor,
) -> str:
    """Why step ``step``'s loss is not finite on worker ``rank``, naming the dense side and
    the sparse side: dense parameters that are not finite, else the largest one (finite
    parameters can still overflow the forward pass), and whether the batch's rows and inputs
    are."""
    named = list(dense_named_parameters(model))
    bad = [name for name, p in named if not bool(torch.isfinite(p).all())]
    head = f"step {step} on worker {rank}: the loss is not finite ({loss})"
    rows_ok = all(bool(torch.isfinite(r).all()) for r in rows.values())
    inputs_ok = bool(torch.isfinite(inputs).all())
    if bad:
        shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
        dense = f"dense parameters {shown} are not finite"
    else:
        name, p = max(named, key=lambda np_: float(np_[1].detach().abs().max()))
        dense = (
            f"the dense parameters are finite but the forward pass overflowed (largest: "
            f"{name}, max |w| {float(p.detach().abs().max()):.3g})"
        )
    sparse = "the batch's embedding rows are " + ("finite" if rows_ok else "NOT finite")
    if rows_ok:
        largest = max((float(r.abs().max()) for r in rows.values() if r.numel()), default=0.0)
        sparse += f" (max |row| {largest:.3g})"
    data = "" if inputs_ok else "; the batch's dense inputs are not finite"
    return (
        f"{head}: {dense} after --dense-optimizer {t.dense_optimizer} updates at --lr "
        f"{t.lr}; {sparse}{data}. Lower --lr (and --sparse-lr, {t.sparse_lr}, if the rows "
        "grew)"
    )
