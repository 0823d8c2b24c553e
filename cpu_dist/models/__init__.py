"""Models: DLRM and the parameter-server-backed embedding layer it (or any model) can use."""

from cpu_dist.models.dlrm import DLRM, build_dlrm
from cpu_dist.models.embedding import RowStore, ShardedEmbedding

__all__ = ["DLRM", "RowStore", "ShardedEmbedding", "build_dlrm"]
