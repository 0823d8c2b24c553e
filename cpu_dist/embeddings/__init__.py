"""TorchRec's embedding API for a model trained here: :class:`EmbeddingBagConfig`,
:class:`KeyedJaggedTensor` in, :class:`EmbeddingBagCollection`, :class:`KeyedTensor` out.

A model is a plain ``nn.Module`` that owns its collections.  Outside a job a collection's rows
are local and lazy (first touch from ``contracts.row_init``, updates by
``contracts.sparse_update``), so the model, as written, is its own single-process reference;
inside a job the framework gives each collection the rows the step pipeline pulled from the
parameter server (docs/DESIGN.md, "The embeddings API").  This package imports torch, numpy
and ``cpu_dist.common`` only: no native module, no MPI, so serving can use it.
"""

from cpu_dist.embeddings.collection import (
    EmbeddingBagCollection,
    collections_of,
    sparse_step,
    table_ids_of,
    unique_ids,
)
from cpu_dist.embeddings.config import (
    DataType,
    EmbeddingBagConfig,
    PoolingType,
    configs_of,
    job_tables_of,
)
from cpu_dist.embeddings.jagged import JaggedTensor, KeyedJaggedTensor, as_keyed_jagged
from cpu_dist.embeddings.keyed import KeyedTensor
from cpu_dist.embeddings.pooling import pool_bags
from cpu_dist.embeddings.rows import LocalRows, RowSource

__all__ = [
    "DataType",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "JaggedTensor",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "LocalRows",
    "PoolingType",
    "RowSource",
    "as_keyed_jagged",
    "collections_of",
    "configs_of",
    "job_tables_of",
    "pool_bags",
    "sparse_step",
    "table_ids_of",
    "unique_ids",
]
