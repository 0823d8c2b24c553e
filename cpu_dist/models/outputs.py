"""What a model's ``forward`` may return: logits ``[B]``, or ``[B, 1]`` as TorchRec's own model
classes return them (``torchrec.models.dlrm.DLRM_DCN``).  One check, which the job, the
single-process reference and the serving CLI all call on every output, so that the three
accept the same models and refuse the rest with the same one line."""

from __future__ import annotations

import torch

from cpu_dist.common.config import ModelError

__all__ = ["logits_of"]


def logits_of(output: object, rows: int, model: str) -> torch.Tensor:
    """``output`` as logits ``[B]`` (``B = rows``): ``[B]`` as it is, ``[B, 1]`` viewed as
    ``[B]`` (gradients flow through the view, so a ``[B, 1]`` model trains as a ``[B]`` one).

    Raises:
        ModelError: anything else (another shape, or not a tensor), naming the model spec
            ``model`` and the shape it returned; an expected error of the job (exit 2).

    Example::

        loss = bce(logits_of(model(dense, kjt), len(labels), "dcnv2"), labels)
    """
    if not isinstance(output, torch.Tensor):
        raise ModelError(
            f"model {model!r}: forward returned a {type(output).__name__}, expected a tensor of "
            f"logits [B] or [B, 1] (B = {rows})"
        )
    shape = tuple(output.shape)
    if shape == (rows,):
        return output
    if shape == (rows, 1):
        return output.reshape(rows)
    shown = "[" + ", ".join(str(n) for n in shape) + "]"
    raise ModelError(
        f"model {model!r}: forward returned logits of shape {shown} for a batch of {rows} "
        f"rows; expected [B] or [B, 1] (B = {rows})"
    )
