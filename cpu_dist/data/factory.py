"""One entry point for both data sources, so the trainer and the reference read alike."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Protocol

from cpu_dist.data.batch import Batch
from cpu_dist.data.criteo import CriteoTSV
from cpu_dist.data.keys import CRITEO_DEFAULT_HASH_SIZE
from cpu_dist.data.synthetic import SyntheticCriteo


class Dataset(Protocol):
    """What the training code needs from a data source."""

    kind: str
    num_dense: int
    num_sparse: int

    def train_batches(
        self, batch_size: int, start_step: int = 0
    ) -> Iterator[tuple[int, Batch]]: ...

    def eval_batches(self, batch_size: int, num_batches: int) -> Iterator[Batch]: ...


def make_dataset(
    kind: str,
    *,
    path: str | os.PathLike | None = None,
    seed: int = 0,
    zipf_exponent: float = 1.05,
    cardinalities: Sequence[int] | None = None,
    num_dense: int = 13,
    num_sparse: int = 26,
    hash_size: int = CRITEO_DEFAULT_HASH_SIZE,
    skip_bad_lines: bool = False,
    eval_every: int = 10,
) -> Dataset:
    """``kind="synthetic"`` (seed, zipf_exponent, cardinalities, num_dense, num_sparse) or
    ``kind="criteo"`` (path, hash_size, skip_bad_lines, eval_every); other arguments are ignored
    by the kind that does not use them."""
    if kind == "synthetic":
        return SyntheticCriteo(
            cardinalities=cardinalities,
            zipf_exponent=zipf_exponent,
            seed=seed,
            num_dense=num_dense,
            num_sparse=num_sparse,
        )
    if kind == "criteo":
        if path is None:
            raise ValueError("the criteo dataset needs a path to a TSV file")
        return CriteoTSV(
            path, hash_size=hash_size, skip_bad_lines=skip_bad_lines, eval_every=eval_every
        )
    raise ValueError(f"unknown dataset kind {kind!r} (expected 'synthetic' or 'criteo')")


def train_batches(
    dataset: Dataset, batch_size: int, start_step: int = 0
) -> Iterator[tuple[int, Batch]]:
    """``(step, global batch)`` from ``start_step`` on: endless for synthetic data, one pass
    over the file for Criteo (the caller stops after its step count)."""
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}")
    return dataset.train_batches(batch_size, start_step)


def eval_batches(dataset: Dataset, batch_size: int, num_batches: int) -> Iterator[Batch]:
    """The first ``num_batches`` global eval batches (always the same ones for a dataset)."""
    return dataset.eval_batches(batch_size, num_batches)
