"""A user's own evaluation metric: ``--metric MODULE:CLASS`` names a ``torchmetrics.Metric``
subclass (``PKG.MODULE:CLASS`` on ``sys.path``, or ``path/to/file.py:CLASS``), made with no
arguments and computed on every evaluation over all of its rows, in the data's order.

Its ``update(preds, target)`` gets every scored row's probability (float64 ``[N]``) and label
(int64 ``[N]``, 0 or 1) at once, and ``compute()`` must give one number; it is logged as
``<split>_<name>``, ``name`` the class's name in snake case (``MeanPrediction``:
``eval_mean_prediction``).  The flag's syntax and the file or package are checked with the
other flags (``cpu_dist.common.metric_spec``); loading the class and trying it on four rows
happen on worker 0 as the job starts (:func:`load_metrics`), a failure there one
``launcher.py: error:`` line naming the flag, exit 2 (:class:`MetricError`)."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from typing import Any

import numpy as np

from cpu_dist.common.metric_spec import BUILT_IN, metric_key, split_metric_spec
from cpu_dist.common.user_files import UserFileError, is_file_target, load_user_file


class MetricError(ValueError):
    """A ``--metric`` that cannot be loaded, made or computed: the flag, the spec and why."""


def _load_module(spec: str, target: str) -> Any:
    """The module ``target`` names: a file loaded under a name of its own, or an import."""
    if is_file_target(target):
        try:
            return load_user_file(target, "metric")
        except UserFileError as exc:
            raise MetricError(f"--metric {spec}: {exc}") from exc
    try:
        return importlib.import_module(target)
    except Exception as exc:
        raise MetricError(
            f"--metric {spec}: cannot import {target}: {type(exc).__name__}: {exc}"
        ) from exc


class UserMetric:
    """One ``--metric``: its class, and the key it is logged under."""

    def __init__(self, spec: str) -> None:
        from torchmetrics import Metric

        target, name = split_metric_spec(spec)
        module = _load_module(spec, target)
        cls = getattr(module, name, None)
        if cls is None:
            raise MetricError(f"--metric {spec}: {target} has no {name!r}")
        if not (isinstance(cls, type) and issubclass(cls, Metric)):
            what = "a class" if isinstance(cls, type) else f"a {type(cls).__name__}"
            raise MetricError(
                f"--metric {spec}: {name} is {what} but not a subclass of torchmetrics.Metric"
            )
        self.spec, self.cls, self.key = spec, cls, metric_key(name)

    def __call__(self, probs: np.ndarray, labels: np.ndarray) -> float:
        """The metric of a whole split: a fresh instance, one update, compute."""
        import torch

        try:
            metric = self.cls()
            metric.update(
                torch.from_numpy(np.ascontiguousarray(probs, dtype=np.float64)),
                torch.from_numpy(np.asarray(labels).astype(np.int64)),
            )
            value = metric.compute()
        except Exception as exc:
            raise MetricError(
                f"--metric {self.spec}: {type(exc).__name__}: {exc}".rstrip(": ")
            ) from exc
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return float(value.reshape(()).item())
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise MetricError(
            f"--metric {self.spec}: compute() gave {type(value).__name__}"
            f"{list(value.shape) if isinstance(value, torch.Tensor) else ''}, not one number"
        )


def load_metrics(specs: Sequence[str]) -> list[UserMetric]:
    """Every ``--metric``, loaded and tried on four rows (MetricError naming the one that
    fails), so that a broken metric stops the job as it starts, not at its first
    evaluation."""
    loaded = [UserMetric(spec) for spec in specs]
    keys = [m.key for m in loaded]
    for m in loaded:
        if m.key in BUILT_IN or keys.count(m.key) > 1:
            raise MetricError(
                f"--metric {m.spec}: its key {m.key!r} is taken (built in: "
                f"{', '.join(BUILT_IN)}; or given twice)"
            )
        m(np.array([0.2, 0.7, 0.4, 0.9]), np.array([0, 1, 1, 0]))
    return loaded
