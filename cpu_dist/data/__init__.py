"""Data sources: a deterministic synthetic Criteo-like stream, the Criteo TSV reader and the
converted (memory-mapped) Criteo layout.

All give global batches (:class:`Batch`, fused int64 keys) by step, and each worker's share of
one alone (``worker_batch``); :class:`~cpu_dist.data.loader.WorkerBatches` prepares a worker's
shares on a background thread.  ``python -m cpu_dist.data.convert`` makes the converted layout
(``layout.py``); ``tsv_parse.py`` is the one TSV parser of the reader and the converter.
"""

from cpu_dist.data.batch import Bags, Batch
from cpu_dist.data.criteo import CriteoFormatError, CriteoTSV
from cpu_dist.data.criteo_bin import CriteoBinary
from cpu_dist.data.factory import (
    KINDS,
    Dataset,
    dataset_for,
    eval_batches,
    make_dataset,
    train_batches,
)
from cpu_dist.data.keys import (
    CRITEO_DEFAULT_HASH_SIZE,
    criteo_hash_sizes,
    fuse_criteo,
    fuse_criteo_columns,
    fuse_synthetic,
    synthetic_offsets,
)
from cpu_dist.data.layout import LayoutError
from cpu_dist.data.loader import WorkerBatches
from cpu_dist.data.synthetic import DEFAULT_CARDINALITIES, SyntheticCriteo

__all__ = [
    "CRITEO_DEFAULT_HASH_SIZE",
    "DEFAULT_CARDINALITIES",
    "KINDS",
    "Bags",
    "Batch",
    "CriteoBinary",
    "CriteoFormatError",
    "CriteoTSV",
    "Dataset",
    "LayoutError",
    "SyntheticCriteo",
    "WorkerBatches",
    "criteo_hash_sizes",
    "dataset_for",
    "eval_batches",
    "fuse_criteo",
    "fuse_criteo_columns",
    "fuse_synthetic",
    "make_dataset",
    "synthetic_offsets",
    "train_batches",
]
