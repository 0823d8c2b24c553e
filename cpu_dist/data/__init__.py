"""Data sources: a deterministic synthetic Criteo-like stream and a real Criteo TSV reader.

Both yield :class:`Batch` objects of global batches with fused int64 keys; workers take
their slice with :meth:`Batch.shard`.
"""

from cpu_dist.data.batch import Batch
from cpu_dist.data.criteo import CriteoFormatError, CriteoTSV
from cpu_dist.data.factory import Dataset, eval_batches, make_dataset, train_batches
from cpu_dist.data.keys import (
    CRITEO_DEFAULT_HASH_SIZE,
    fuse_criteo,
    fuse_synthetic,
    synthetic_offsets,
)
from cpu_dist.data.synthetic import DEFAULT_CARDINALITIES, SyntheticCriteo

__all__ = [
    "CRITEO_DEFAULT_HASH_SIZE",
    "DEFAULT_CARDINALITIES",
    "Batch",
    "CriteoFormatError",
    "CriteoTSV",
    "Dataset",
    "SyntheticCriteo",
    "eval_batches",
    "fuse_criteo",
    "fuse_synthetic",
    "make_dataset",
    "synthetic_offsets",
    "train_batches",
]
