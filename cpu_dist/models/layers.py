"""Layers the built-in models share."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def mlp(in_size: int, widths: Sequence[int], last_activation: bool) -> nn.Sequential:
    """``Linear`` layers of ``widths`` from ``in_size``, a ReLU after each but the last (and
    after the last too when ``last_activation``): DLRM's bottom MLP ends in one, a top MLP
    that returns logits does not.  Layer ``i`` is ``[2 * i]`` in the Sequential, which the
    checkpoints' parameter names (``bot.0.weight`` ...) depend on."""
    layers: list[nn.Module] = []
    for i, w in enumerate(widths):
        layers.append(nn.Linear(in_size, w))
        if last_activation or i < len(widths) - 1:
            layers.append(nn.ReLU())
        in_size = w
    return nn.Sequential(*layers)
