"""The data's features: their names and the default job's counts, the contract between the data
readers (``cpu_dist.data``: they name their columns from here) and the job's configuration (the
flag-declared table serves :data:`CATEGORICAL_FEATURES`; a job file's features are checked
against the data's).  Both sides need it, so it lives in the bottom layer, apart from what a
table is (:mod:`cpu_dist.common.tables`).

The features are named as TorchRec names Criteo's: categorical ``cat_0`` ... ``cat_25``, dense
``int_0`` ... ``int_12``.  The synthetic stream serves features of other names too (a job
file's); :data:`NAMED_CARDINALITY` and :data:`MAX_NAMED_CARDINALITY` bound those.
"""

from __future__ import annotations

NUM_CATEGORICAL = 26  # Criteo's, and the synthetic stream's
NUM_DENSE = 13


def categorical_names(n: int = NUM_CATEGORICAL) -> tuple[str, ...]:
    """``cat_0`` ... ``cat_{n-1}``: the categorical features' names (TorchRec's)."""
    return tuple(f"cat_{i}" for i in range(n))


def dense_names(n: int = NUM_DENSE) -> tuple[str, ...]:
    """``int_0`` ... ``int_{n-1}``: the dense features' names (TorchRec's)."""
    return tuple(f"int_{i}" for i in range(n))


CATEGORICAL_FEATURES = categorical_names()
DENSE_FEATURES = dense_names()
# Synthetic data's features of other names (cpu_dist/data/synthetic.py): the cardinality of
# one that neither [data] cardinalities nor its table's num_embeddings gives, and the largest
# (its Zipf CDF is 8 bytes a rank: 2**24, 128 MiB).
NAMED_CARDINALITY = 100_000
MAX_NAMED_CARDINALITY = 2**24
