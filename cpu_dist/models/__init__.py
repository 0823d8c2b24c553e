"""Models over ``EmbeddingBagCollection``s: the built-in DLRM (a job's default) and
DLRM-DCNv2, and the model factory (built-in names and users' ``PKG.MODULE:FUNC`` /
``path/to/file.py:FUNC`` factories)."""

from cpu_dist.models.dcnv2 import DLRMDCNv2, LowRankCrossNet, dcnv2
from cpu_dist.models.dlrm import DLRM, dlrm
from cpu_dist.models.factory import (
    BUILTIN_MODELS,
    ModelError,
    build_model,
    resolve_model,
    source_sha256,
)

__all__ = [
    "BUILTIN_MODELS",
    "DLRM",
    "DLRMDCNv2",
    "LowRankCrossNet",
    "ModelError",
    "build_model",
    "dcnv2",
    "dlrm",
    "resolve_model",
    "source_sha256",
]
