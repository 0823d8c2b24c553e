"""How well a model's logits predict 0/1 labels: the evaluation metrics of training runs and
of the serving tool, defined once (scikit-learn's definitions)."""

from __future__ import annotations

import numpy as np


def evaluate(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """``{"auc", "logloss"}`` of logits against 0/1 labels (scikit-learn's definitions).

    AUC is NaN when the labels hold one class only (it is undefined there).
    """
    from sklearn.metrics import log_loss, roc_auc_score  # seconds to import: when needed

    s = np.asarray(logits, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    if s.shape != y.shape or s.size == 0:
        raise ValueError(f"need equally many logits and labels (> 0), got {s.shape} and {y.shape}")
    p = np.exp(-np.logaddexp(0.0, -s))  # sigmoid without overflow
    auc = float(roc_auc_score(y, s)) if np.unique(y).size == 2 else float("nan")
    return {"auc": auc, "logloss": float(log_loss(y, p, labels=[0.0, 1.0]))}
