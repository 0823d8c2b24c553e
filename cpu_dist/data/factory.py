"""One entry point for every data source, so the trainer and the reference read alike."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from cpu_dist.common.config import DATA_KINDS, DataConfig
from cpu_dist.common.features import categorical_names, dense_names
from cpu_dist.data.batch import Batch
from cpu_dist.data.criteo import CriteoTSV
from cpu_dist.data.criteo_bin import CriteoBinary
from cpu_dist.data.keys import CRITEO_DEFAULT_HASH_SIZE, criteo_hash_sizes
from cpu_dist.data.multi_hot import MultiHot
from cpu_dist.data.parquet import ParquetColumns, ParquetData
from cpu_dist.data.synthetic import SyntheticCriteo

KINDS = DATA_KINDS


class Dataset(Protocol):
    """What the training code needs from a data source.

    ``train_batches`` gives global batches (the reference trains on them); ``worker_batch``
    gives one worker's share of a step's global batch alone, by step (what the background
    loader, ``loader.WorkerBatches``, reads); the two agree: the global batch is the shares
    concatenated in rank order.  ``test_batches`` is the held-out test split (none for one
    Criteo file)."""

    kind: str
    num_dense: int
    num_sparse: int

    def train_batches(
        self, batch_size: int, start_step: int = 0
    ) -> Iterator[tuple[int, Batch]]: ...

    def worker_batch(self, step: int, batch_size: int, rank: int, world: int) -> Batch | None: ...

    def eval_batches(self, batch_size: int, num_batches: int | None) -> Iterator[Batch]: ...

    def test_batches(self, batch_size: int, num_batches: int | None = None) -> Iterator[Batch]: ...


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
    num_embeddings_per_feature: Sequence[int] | None = None,
    max_ind_range: int | None = None,
    skip_bad_lines: bool = False,
    eval_every: int = 10,
    epochs: int | None = 1,
    shuffle: bool = False,
    bags: Mapping[str, tuple[int, int]] | None = None,
    weights: Sequence[str] = (),
    features: Sequence[str] | None = None,
    named_cardinalities: Mapping[str, int] | None = None,
    multi_hot_sizes: Sequence[int] | None = None,
    multi_hot_distribution: str = "uniform",
    parquet: ParquetColumns | None = None,
) -> Dataset:
    """``kind="synthetic"`` (seed, zipf_exponent, cardinalities, num_dense, num_sparse, the
    multi-hot features ``bags = {feature: (MIN, MAX)}`` and weighted ones ``weights``, and the
    features by name, ``features`` and ``named_cardinalities``; endless),
    ``kind="criteo"`` (path: a TSV file) or ``kind="criteo-bin"`` (path: a converted directory),
    both with the hashing (hash_size, num_embeddings_per_feature, max_ind_range: see
    ``keys.criteo_hash_sizes``), eval_every, epochs, shuffle and seed, for TSV
    skip_bad_lines, and ``multi_hot_sizes`` (Criteo made multi-hot,
    :mod:`cpu_dist.data.multi_hot`); ``kind="parquet"`` (path: a file or directory; parquet:
    the columns it reads, :func:`cpu_dist.data.parquet.resolve_columns`), with eval_every,
    epochs, shuffle and seed.  Arguments a kind does not use are ignored."""
    if kind == "synthetic":
        return SyntheticCriteo(
            cardinalities=cardinalities,
            zipf_exponent=zipf_exponent,
            seed=seed,
            num_dense=num_dense,
            num_sparse=num_sparse,
            bags=bags,
            weights=weights,
            features=features,
            named_cardinalities=named_cardinalities,
        )
    if kind not in KINDS:
        raise ValueError(f"unknown dataset kind {kind!r} (expected one of {', '.join(KINDS)})")
    if bags or weights:
        named = sorted({*(bags or {}), *weights})
        raise ValueError(
            f"bags and weights (of {', '.join(named)}) are drawn by kind 'synthetic' alone "
            f"(kind {kind!r}: multi-hot Criteo comes with multi_hot_sizes, Parquet's bags and "
            "weights with its columns)"
        )
    if path is None:
        raise ValueError(f"the {kind} dataset needs a path")
    if kind == "parquet":
        if parquet is None:
            raise ValueError("the parquet dataset needs its columns (parquet=)")
        return ParquetData(
            path, parquet, eval_every=eval_every, epochs=epochs, shuffle=shuffle, seed=seed
        )
    return _criteo(
        kind,
        path,
        seed=seed,
        hash_size=hash_size,
        hash_sizes=criteo_hash_sizes(num_embeddings_per_feature, max_ind_range, hash_size),
        skip_bad_lines=skip_bad_lines,
        eval_every=eval_every,
        epochs=epochs,
        shuffle=shuffle,
        multi_hot_sizes=multi_hot_sizes,
        multi_hot_distribution=multi_hot_distribution,
    )


def _criteo(
    kind: str,
    path: str | os.PathLike,
    *,
    seed: int,
    hash_size: int,
    hash_sizes: Sequence[int],
    skip_bad_lines: bool,
    eval_every: int,
    epochs: int | None,
    shuffle: bool,
    multi_hot_sizes: Sequence[int] | None,
    multi_hot_distribution: str,
) -> Dataset:
    """The two Criteo kinds (``criteo``: a TSV file, ``criteo-bin``: a converted directory),
    hashed to ``hash_sizes`` and, with ``multi_hot_sizes``, made multi-hot."""
    multi_hot = (
        None
        if multi_hot_sizes is None
        else MultiHot(
            multi_hot_sizes,
            hash_sizes,
            categorical_names(len(hash_sizes)),
            seed,
            multi_hot_distribution,
        )
    )
    if kind == "criteo":
        return CriteoTSV(
            path,
            hash_size=hash_size,
            skip_bad_lines=skip_bad_lines,
            eval_every=eval_every,
            hash_sizes=hash_sizes,
            epochs=epochs,
            shuffle=shuffle,
            seed=seed,
            multi_hot=multi_hot,
        )
    return CriteoBinary(
        path,
        hash_sizes=hash_sizes,
        eval_every=eval_every,
        epochs=epochs,
        shuffle=shuffle,
        seed=seed,
        multi_hot=multi_hot,
    )


def train_batches(
    dataset: Dataset, batch_size: int, start_step: int = 0
) -> Iterator[tuple[int, Batch]]:
    """``(step, global batch)`` from ``start_step`` on: endless for synthetic data, up to the
    end of the last epoch for Criteo files (the caller stops after its step count)."""
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}")
    return dataset.train_batches(batch_size, start_step)


def eval_batches(dataset: Dataset, batch_size: int, num_batches: int | None) -> Iterator[Batch]:
    """The first ``num_batches`` global eval batches (always the same ones for a dataset);
    None: all of the split (file data, the last partial batch included; synthetic data: 4)."""
    return dataset.eval_batches(batch_size, num_batches)


def feature_names(dataset: Dataset) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(dense, categorical)`` feature names of a dataset in column order (``int_0`` ...,
    ``cat_0`` ...; TorchRec's names for Criteo's; Parquet's: its columns): the names a job
    file's tables refer to."""
    columns = getattr(dataset, "columns", None)
    if isinstance(columns, ParquetColumns):
        return columns.dense, columns.features
    named = getattr(dataset, "sparse_names", None)  # synthetic data's, by the job's tables
    return dense_names(dataset.num_dense), tuple(named or categorical_names(dataset.num_sparse))


def dataset_for(data: DataConfig, seed: int) -> Dataset:
    """The dataset of a job's ``--data`` flags and job file's ``[data]`` (the trainer's, and
    any tool that must read the same batches); ``data.bags`` ``((feature, MIN, MAX), ...)`` and
    ``data.weights`` become the synthetic stream's multi-hot and weighted features."""
    bags = {name: (lo, hi) for name, lo, hi in data.bags}
    return make_dataset(
        data.kind,
        path=data.path,
        seed=seed,
        zipf_exponent=data.zipf_exponent,
        skip_bad_lines=data.skip_bad_lines,
        num_embeddings_per_feature=data.num_embeddings_per_feature,
        max_ind_range=data.max_ind_range,
        epochs=data.epochs,
        shuffle=data.shuffle,
        num_dense=data.num_dense,
        features=(data.features or None) if data.kind == "synthetic" else None,
        named_cardinalities=dict(data.cardinalities),
        bags=bags,
        weights=() if data.kind == "parquet" else data.weights,
        multi_hot_sizes=data.multi_hot_sizes,
        multi_hot_distribution=data.multi_hot_distribution,
        parquet=parquet_columns(data) if data.kind == "parquet" else None,
    )


def parquet_columns(data: DataConfig) -> ParquetColumns:
    """The Parquet columns a job's ``DataConfig`` names (validation resolved them)."""
    return ParquetColumns(
        features=data.features,
        dense=data.dense,
        label=data.label,
        weights=dict(data.weight_columns),
    )
