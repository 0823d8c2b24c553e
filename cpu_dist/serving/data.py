"""Which data ``python -m cpu_dist.serving`` scores a bundle on: what the command line names,
then a ``--config`` job file's data (its ``[data]``, ``path`` included, and its ``[job]`` data
flags), then what the bundle records (:class:`~cpu_dist.serving.bundle.DataSpec`).

A bundle of version 5 records all the data its job read (``DataSpec.recorded``: the path,
Parquet's columns, Criteo's multi-hot sizes, the synthetic stream's features, dense width and
cardinalities), so it scores as trained with no flag at all; data that would be read
otherwise (another kind, other hashing, other bags, weights, columns, dense width or
cardinalities) is refused naming the setting, never scored differently.  An older bundle
fills in what it records; a Parquet bundle that does not record its columns, and a synthetic
one of features of other names that does not record their cardinalities, need the job file.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from cpu_dist.common.config import DataConfig
from cpu_dist.common.config_errors import ConfigError
from cpu_dist.common.data_checks import parquet_columns, parquet_schema
from cpu_dist.common.features import CATEGORICAL_FEATURES
from cpu_dist.common.job_data import DATA_FLAG_KEYS
from cpu_dist.common.job_file import JobFile, read_job_file
from cpu_dist.common.parquet_schema import ParquetColumns
from cpu_dist.common.validate_data import data_config
from cpu_dist.data import eval_batches
from cpu_dist.data.batch import Batch
from cpu_dist.data.factory import Dataset
from cpu_dist.data.file_dataset import FileDataset
from cpu_dist.data.synthetic import HELD_OUT_BATCHES, SyntheticCriteo
from cpu_dist.serving.bundle import Bundle, BundleError, DataSpec, data_family
from cpu_dist.serving.loader import bundle_job_tables

__all__ = ["DATA_DESTS", "SPLITS", "bundle_data", "read_config", "split_batches"]

# The data flags' dests (add_data_flags): a job file's values for them are the data's.
DATA_DESTS = (
    "data",
    "data_path",
    "skip_bad_lines",
    "zipf_exponent",
    "num_embeddings_per_feature",
    "max_ind_range",
    "epochs",
    "shuffle",
    "multi_hot_sizes",
    "multi_hot_distribution",
)
SPLITS = ("eval", "test", "train", "all")


def _kind(kind: str) -> str:
    return {
        "synthetic": "synthetic data",
        "parquet": "Parquet data (--data parquet)",
    }.get(kind, "Criteo data (--data criteo or criteo-bin)")


def read_config(args: argparse.Namespace, given: set[str]) -> JobFile | None:
    """``--config``'s job file: its ``[data]`` flag keys (``kind``, ``path``, the multi-hot
    ones) and its ``[job]`` data flags become the data flags' values where the command line
    names none (``given``)."""
    if args.config is None:
        return None
    job_file = read_job_file(args.config)
    values = {k: v for k, v in job_file.job.items() if k in DATA_DESTS}
    for dest in DATA_FLAG_KEYS.values():
        if job_file.data.flag(dest) is not None:
            values[dest] = job_file.data.flag(dest)
    for key, value in values.items():
        if key not in given:
            setattr(args, key, value)
    return job_file


def _refuse(bundle: Bundle, what: str, want: object, got: object, where: str) -> None:
    """One line: the bundle's data was read with ``want``, ``where`` says ``got``."""
    raise BundleError(
        f"bundle {bundle.path}: its job read the data with {what} {want!r}; {where} says "
        f"{got!r}, which would score other rows or features than it was trained on"
    )


def _kind_and_path(a: argparse.Namespace, bundle: Bundle, d: DataSpec) -> None:
    """``a.data`` and ``a.data_path``: given, else the bundle's (a Criteo bundle's kind
    follows a given ``--data-path``: a directory is a conversion)."""
    if a.data is None:
        if d.family == "criteo" and a.data_path:
            a.data = "criteo-bin" if os.path.isdir(a.data_path) else "criteo"
        else:
            a.data = d.kind
    elif data_family(a.data) != d.family:
        raise BundleError(
            f"bundle {bundle.path} was trained on {_kind(d.kind)}; --data {a.data} is another "
            "kind of data, whose keys are not the bundle's"
        )
    if a.data_path is None and a.data != "synthetic" and d.recorded:
        if d.path is None:
            raise BundleError(
                f"bundle {bundle.path}: its data's path was not found when it was exported; "
                "give --data-path"
            )
        a.data_path = d.path


def _criteo_flags(a: argparse.Namespace, d: DataSpec) -> None:
    """The hashing and multi-hot flags not given: the bundle's."""
    if a.max_ind_range is None:
        a.max_ind_range = d.max_ind_range
    if a.num_embeddings_per_feature is None and d.num_embeddings_per_feature is not None:
        a.num_embeddings_per_feature = ",".join(map(str, d.num_embeddings_per_feature))
    if d.recorded:
        if a.multi_hot_sizes is None and d.multi_hot_sizes is not None:
            a.multi_hot_sizes = ",".join(map(str, d.multi_hot_sizes))
        if a.multi_hot_distribution is None:
            a.multi_hot_distribution = d.multi_hot_distribution
        if a.data == "criteo" and d.skip_bad_lines:
            a.skip_bad_lines = True


def _check_criteo(bundle: Bundle, cfg: DataConfig, d: DataSpec) -> None:
    """Other hashing (or, recorded, other multi-hot bags) would make other keys: refused."""
    checks: list[tuple[str, Any, Any]] = [
        ("--max-ind-range", cfg.max_ind_range, d.max_ind_range),
        ("--num-embeddings-per-feature", cfg.num_embeddings_per_feature,
         d.num_embeddings_per_feature),
    ]  # fmt: skip
    if d.recorded:
        checks += [
            ("--multi-hot-sizes", cfg.multi_hot_sizes, d.multi_hot_sizes),
            ("--multi-hot-distribution", cfg.multi_hot_distribution, d.multi_hot_distribution),
        ]
    for flag, got, want in checks:
        if got != want:

            def said(v: object, flag: str = flag) -> str:
                return f"no {flag}" if v is None else f"{flag} {v}"

            raise BundleError(
                f"bundle {bundle.path}: its keys were made with {said(want)}; {said(got)} "
                "would hash the data into other keys"
            )


def _parquet_columns(
    a: argparse.Namespace, bundle: Bundle, d: DataSpec, job_file: JobFile | None
) -> ParquetColumns:
    """The Parquet columns to read: the bundle's (version 5), where a job file's ``[data]``
    column keys, if it has any, must agree; an older bundle's from the job file."""
    if d.recorded:
        cols = ParquetColumns(d.features, d.dense, d.label, dict(d.weight_columns))
        section = job_file.data if job_file is not None else None
        if section is not None:
            where = f"{job_file.path if job_file else ''} [data]"
            if section.label is not None and section.label != cols.label:
                _refuse(bundle, "label column", cols.label, section.label, f"{where} label")
            if section.dense is not None and section.dense != cols.dense:
                _refuse(bundle, "dense columns", list(cols.dense), list(section.dense),
                        f"{where} dense")  # fmt: skip
            if section.weight_columns and dict(section.weight_columns) != cols.weights:
                _refuse(bundle, "weight columns", dict(cols.weights),
                        dict(section.weight_columns), f"{where} weights")  # fmt: skip
        return cols
    if job_file is None:
        weighted = f" (weights of {', '.join(d.weights)})" if d.weights else ""
        raise BundleError(
            f"bundle {bundle.path}: a Parquet bundle of version {bundle.version} does not "
            f"record the columns its job read{weighted}; give the job's file with --config "
            "(or export it again with this version)"
        )
    cols = parquet_columns(a, parquet_schema(a), bundle.model.data_features or None)
    if d.weights and set(d.weights) != set(cols.weights):
        _refuse(bundle, "weighted features", list(d.weights), sorted(cols.weights),
                f"{job_file.path} [data] weights")  # fmt: skip
    return cols


def _synthetic_config(
    a: argparse.Namespace, bundle: Bundle, d: DataSpec, job_file: JobFile | None
) -> DataConfig:
    """The synthetic data as the flags and a job file say (its bags and weights over the
    bundle's features; its dense width and cardinalities).  The bundle's tables make the
    cardinalities only where the bundle does not record them or the job file gives some: a
    table's ``num_embeddings`` may be more than the stream takes where the job's file said
    otherwise."""
    tables = bundle_job_tables(bundle)
    cards_given = job_file is not None and bool(job_file.data.cardinalities)
    from_tables = not tables.fused and (d.cardinalities is None or cards_given)
    return data_config(a, tables.data_features, tables=tables if from_tables else None)


def _synthetic_shape(
    bundle: Bundle, d: DataSpec, job_file: JobFile | None, cfg: DataConfig
) -> DataConfig:
    """The synthetic stream's features, dense width and cardinalities: the bundle's, where a
    job file's ``[data] dense`` and ``cardinalities``, if it has them, must agree (``cfg``:
    the job file's, over the bundle's tables).  A bundle that does not record them (older)
    takes the job file's, else its model's dense width; one whose features of other names
    were drawn over cardinalities it does not say needs the job file."""
    section = job_file.data if job_file is not None else None
    where = f"{job_file.path if job_file else ''} [data]"
    dense_given = section is not None and section.dense_width is not None
    cards_given = section is not None and bool(section.cardinalities)
    num_dense, cards = d.num_dense, d.cardinalities
    if num_dense is None:
        num_dense = cfg.num_dense if dense_given else bundle.model.dense_features
    elif dense_given and cfg.num_dense != num_dense:
        _refuse(bundle, "dense width", num_dense, cfg.num_dense, f"{where} dense")
    if cards is None:
        own = [f for f in d.features if f not in CATEGORICAL_FEATURES]
        if own and job_file is None:
            raise BundleError(
                f"bundle {bundle.path}: its synthetic features {', '.join(own)} were drawn "
                "over cardinalities it does not record (exported by an older version); give "
                "the job's file with --config"
            )
        cards = cfg.cardinalities
    elif cards_given and cfg.cardinalities != cards:
        _refuse(bundle, "cardinalities", dict(cards), dict(cfg.cardinalities),
                f"{where} cardinalities")  # fmt: skip
    if num_dense != bundle.model.dense_features:
        raise BundleError(
            f"bundle {bundle.path}: its model takes {bundle.model.dense_features} dense "
            f"features; the synthetic stream would make {num_dense}"
            + (f" ({where} dense)" if dense_given else "")
        )
    features = d.features if d.recorded else cfg.features
    return dataclasses.replace(cfg, num_dense=num_dense, features=features, cardinalities=cards)


def bundle_data(
    args: argparse.Namespace, bundle: Bundle, job_file: JobFile | None = None
) -> DataConfig:
    """The data to score ``bundle`` on (see the module docstring): the command line's flags,
    a ``--config`` job file's data, the bundle's record where neither names them."""
    a = argparse.Namespace(**vars(args))
    d = bundle.data
    if a.multi_hot_distribution is None and (d is None or not d.recorded):
        a.multi_hot_distribution = DataConfig.multi_hot_distribution
    if d is None:  # a version 1 bundle: the flags as given
        a.data = a.data or DataConfig.kind
        a.zipf_exponent = DataConfig.zipf_exponent if a.zipf_exponent is None else a.zipf_exponent
        return data_config(a)
    _kind_and_path(a, bundle, d)
    if a.zipf_exponent is None:
        a.zipf_exponent = d.zipf_exponent
    if d.family == "criteo":
        _criteo_flags(a, d)
    if a.multi_hot_distribution is None:
        a.multi_hot_distribution = d.multi_hot_distribution
    cols = _parquet_columns(a, bundle, d, job_file) if a.data == "parquet" else None
    if a.data == "synthetic":
        cfg = _synthetic_shape(bundle, d, job_file, _synthetic_config(a, bundle, d, job_file))
    else:
        cfg = data_config(a, parquet=cols)
    if d.family == "criteo":
        _check_criteo(bundle, cfg, d)
    drawn = job_file is not None and (job_file.bags or job_file.weights) and a.data != "parquet"
    if d.recorded:
        theirs = (job_file.bags, job_file.weights) if job_file is not None else None
        if drawn and theirs is not None and theirs != (d.bags, d.weights):
            _refuse(bundle, "bags and weights", [d.bags, d.weights], list(theirs),
                    f"{args.config} [data]")  # fmt: skip
    elif drawn and job_file is not None:  # an older bundle: the job file's
        return dataclasses.replace(cfg, bags=job_file.bags, weights=job_file.weights)
    return dataclasses.replace(cfg, bags=d.bags, weights=d.weights)


def split_batches(
    dataset: Dataset, split: str, batch_size: int, count: int | None
) -> Iterator[Batch]:
    """The global batches of ``split`` (:data:`SPLITS`) to score: the first ``count`` (None:
    all of the split, its last partial batch included; the synthetic stream: 4 batches)."""
    if split == "eval":
        return eval_batches(dataset, batch_size, count)
    if isinstance(dataset, FileDataset):
        return dataset.split_batches(split, batch_size, count)
    if split == "all":
        raise ConfigError(
            "--split all: the synthetic stream never ends, so it has no 'every row'; give "
            "--split eval, test or train (with --eval-batches N)"
        )
    if split == "test" or not isinstance(dataset, SyntheticCriteo):
        return dataset.test_batches(batch_size, count)
    n = HELD_OUT_BATCHES if count is None else count
    return (dataset.global_batch(i, batch_size, "train") for i in range(n))
