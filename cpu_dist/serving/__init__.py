"""Scoring an exported model without MPI, a parameter server or the native module.

``cpu_dist.serving.load(BUNDLE)`` returns the trained model (any model: built-in or the
user's), ``module(dense, KeyedJaggedTensor) -> logits``; ``python -m cpu_dist.serving BUNDLE``
scores it on the data and prints one JSON line with ``eval_auc`` and ``eval_logloss``
(``--scores-out FILE``: one probability per row).  The bundle's layout:
:mod:`cpu_dist.serving.bundle`.

``load`` is imported on first use: a parameter-server rank imports
:mod:`cpu_dist.serving.errors` and must not pay for torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load"]


def __getattr__(name: str) -> Any:
    if name == "load":
        from cpu_dist.serving.loader import load

        return load
    raise AttributeError(f"module 'cpu_dist.serving' has no attribute {name!r}")
