"""cpu_dist: DLRM-style recommendation training across MPI ranks with parameter-server shards.

The embeddings API (:mod:`cpu_dist.embeddings`: ``EmbeddingBagConfig``,
``EmbeddingBagCollection``, ``KeyedJaggedTensor``, ``KeyedTensor``, ...) is re-exported here,
loaded on first use so that ``import cpu_dist`` stays light (no torch until a name is read).
"""

from __future__ import annotations

import importlib
from typing import Any

_EMBEDDINGS = (
    "DataType",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "JaggedTensor",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "PoolingType",
)


def __getattr__(name: str) -> Any:
    if name in _EMBEDDINGS:
        return getattr(importlib.import_module("cpu_dist.embeddings"), name)
    raise AttributeError(f"module 'cpu_dist' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EMBEDDINGS])
