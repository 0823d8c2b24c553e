"""``--metric MODULE:CLASS``: its syntax and where its source is, checked with the other
flags (nothing imported: torchmetrics and the user's module are loaded by the job's worker 0,
``cpu_dist.train.user_metric``)."""

from __future__ import annotations

import re

from cpu_dist.common.config import model_source_problem
from cpu_dist.common.user_files import is_file_target

_CLASS_RE = re.compile(r"[A-Za-z_]\w*")
_MODULE_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
# The evaluation's own figures (cpu_dist.models.scoring.METRICS) and its row count: a user
# metric may not take their keys.
BUILT_IN = ("auc", "logloss", "ne", "calibration", "ctr", "samples")


def split_metric_spec(spec: str) -> tuple[str, str]:
    """``(module or file, class name)`` of a spec whose syntax is good."""
    target, name = spec.rsplit(":", 1)
    return target, name


def metric_key(class_name: str) -> str:
    """The key a metric class is logged under (after ``eval_``): its name in snake case,
    ``MeanPrediction`` -> ``mean_prediction``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", class_name).lower()


def metric_spec_problem(spec: str) -> str | None:
    """Why ``spec`` cannot name a metric class: bad syntax, a file that does not exist or a
    top-level package that is not installed; None otherwise."""
    forms = "PKG.MODULE:CLASS or path/to/file.py:CLASS"
    if ":" not in spec:
        return f"expected {forms}"
    target, name = split_metric_spec(spec)
    if not _CLASS_RE.fullmatch(name):
        return f"{name!r} is not a class name (expected {forms})"
    is_file = is_file_target(target)
    if not is_file and not _MODULE_RE.fullmatch(target):
        return f"{target!r} is neither a dotted module name nor a .py file (expected {forms})"
    if metric_key(name) in BUILT_IN:
        return f"{name} would be logged as eval_{metric_key(name)}, a built-in figure's key"
    problem = model_source_problem(spec)
    return None if problem is None else problem.replace(":FUNC", ":CLASS")
