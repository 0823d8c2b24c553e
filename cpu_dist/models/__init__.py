"""Models: DLRM and the parameter-server-backed embedding layer it (or any model) can use;
DLRM-DCNv2 over an EmbeddingBagCollection and the model factory (built-in names and users'
``PKG.MODULE:FUNC`` / ``path/to/file.py:FUNC`` factories)."""

from cpu_dist.models.dcnv2 import DLRMDCNv2, LowRankCrossNet, dcnv2
from cpu_dist.models.dlrm import DLRM, build_dlrm
from cpu_dist.models.embedding import RowStore, ShardedEmbedding
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
    "RowStore",
    "ShardedEmbedding",
    "build_dlrm",
    "build_model",
    "dcnv2",
    "resolve_model",
    "source_sha256",
]
