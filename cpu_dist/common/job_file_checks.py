"""A job file (``--config``) against the flags: the checks ``validate`` runs where the
file's tables and ``[data]`` meet the flags, and the warnings for table-default flags every
table overrides.

Refusals are :class:`~cpu_dist.common.job_file.JobFileError`s (``validate`` reports them as
ConfigErrors, with the same message), naming the flag, the file and, where one is at fault,
the table.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from cpu_dist.common import modes
from cpu_dist.common.config import TrainConfig
from cpu_dist.common.features import CATEGORICAL_FEATURES
from cpu_dist.common.job_file import (
    JobFile,
    JobFileError,
    TableDefaults,
    job_tables,
    read_job_file,
)
from cpu_dist.common.tables import JobTables


def job_file_of(a: argparse.Namespace) -> JobFile | None:
    """The ``--config`` job file: the one ``flags.parse_args`` read (``a.job_file``), else
    read now (a Namespace built otherwise); None without ``--config``."""
    job_file = getattr(a, "job_file", None)
    if job_file is not None:
        return job_file
    path = getattr(a, "config", None)
    return read_job_file(path) if path else None


def job_file_tables(
    a: argparse.Namespace, train: TrainConfig, columns: Sequence[str] | None = None
) -> JobTables | None:
    """The tables of the ``--config`` job file (None: no job file, or one without
    ``[[tables]]``: the flags declare the one table).  A table that omits a key takes the
    flags' value (``--embedding-dim``, ``--sparse-optimizer``, ``--sparse-lr``,
    ``--init-scale``, ``--ps-admit-after``, ``--ps-expire-after``).  ``columns``: Parquet
    data's columns a table may name (None: Criteo's and the synthetic stream's features)."""
    path = getattr(a, "config", None)
    if not path:
        return None
    for flag, value in (
        ("--num-embeddings-per-feature", a.num_embeddings_per_feature),
        ("--max-ind-range", a.max_ind_range),
    ):
        if value is not None:
            raise JobFileError(
                f"{flag}: refused beside a job file (--config {path}): give each table its "
                "num_embeddings"
            )
    for flag, value in (
        ("--ps-admit-after", a.ps_admit_after),
        ("--ps-expire-after", a.ps_expire_after),
    ):
        if value < 0:
            raise JobFileError(f"{flag} {value}: must be >= 0")
    job_file = job_file_of(a)
    if job_file is None:
        return None
    if columns is None and a.data == "synthetic":  # any name: cat_0 ... cat_25, then others
        named = [f for t in job_file.tables for f in _names(t.get("features"))]
        others = [f for f in dict.fromkeys(named) if f not in CATEGORICAL_FEATURES]
        return job_tables(
            job_file,
            _defaults(a, train),
            (*CATEGORICAL_FEATURES, *others),
            a.data,
            every_feature=False,
        )
    return job_tables(
        job_file,
        _defaults(a, train),
        CATEGORICAL_FEATURES if columns is None else columns,
        a.data if columns is None else f"{a.data} {a.data_path}",  # names the files
        every_feature=columns is None,
    )


def _names(features: object) -> list[str]:
    """A raw ``[[tables]]`` entry's feature names (its shape is ``job_tables``' to check)."""
    return [f for f in features if isinstance(f, str)] if isinstance(features, list) else []


def _defaults(a: argparse.Namespace, train: TrainConfig) -> TableDefaults:
    return TableDefaults(
        dim=a.embedding_dim,
        optimizer=a.sparse_optimizer,
        lr=train.sparse_lr,
        init_scale=a.init_scale,
        admit_after=a.ps_admit_after,
        expire_after=a.ps_expire_after,
    )


def job_file_bags(
    a: argparse.Namespace, data_features: Sequence[str]
) -> tuple[tuple[tuple[str, int, int], ...], tuple[str, ...]]:
    """The job file's ``[data] bags`` and ``weights`` (``DataConfig.bags``, ``.weights``);
    empty without a job file.  Refused, naming the file, the key and the feature: a feature
    that is not one of ``data_features`` (the job's tables' features); drawn bags and
    weights with a ``--data`` other than ``synthetic``; Parquet's keys (weight columns,
    ``label``, ``dense``) with another ``--data``.  ``--read-mode bagpipe`` is not refused
    here: the cache stage's own checks say what it serves."""
    job_file = job_file_of(a)
    if job_file is None:
        return (), ()
    keyed = [("bags", f) for f, _, _ in job_file.bags] + [("weights", f) for f in job_file.weights]
    known = set(data_features)
    for key, feature in keyed:
        if feature not in known:
            shown = (
                f"{data_features[0]} ... {data_features[-1]}" if data_features else "no features"
            )
            raise JobFileError(
                f"{job_file.path}: [data] {key}: {feature!r} is not a feature of the data "
                f"(--data {a.data} has {shown})"
            )
    section = job_file.data
    if a.data != "synthetic":
        for key, given in (
            ("dense", section.dense_width is not None),
            ("cardinalities", bool(section.cardinalities)),
        ):
            if given:
                raise JobFileError(
                    f"{job_file.path}: [data] {key}: shapes the synthetic stream (--data "
                    f"synthetic), not --data {a.data}"
                )
    if a.data == "parquet":
        if section.bags:
            raise JobFileError(
                f"{job_file.path}: [data] bags: {section.bags[0][0]!r}: Parquet data's bags are "
                "its list<int64> columns; bags = {...} draws them for --data synthetic"
            )
        if section.weights and not section.weight_columns:
            raise JobFileError(
                f"{job_file.path}: [data] weights: {section.weights[0]!r}: Parquet data's "
                'weights are columns: weights = { FEATURE = "COLUMN" }'
            )
    else:
        if section.weight_columns:
            f, c = section.weight_columns[0]
            raise JobFileError(
                f"{job_file.path}: [data] weights: {f!r} = {c!r}: weight columns are read from "
                f"--data parquet, not --data {a.data}"
            )
        for key, value in (("label", section.label), ("dense", section.dense)):
            if value is not None:
                raise JobFileError(
                    f"{job_file.path}: [data] {key}: Parquet's columns; --data {a.data} has no "
                    "columns to name" + (" (its dense width: dense = N)" if key == "dense" else "")
                )
        if keyed and a.data != "synthetic":
            key, feature = keyed[0]
            raise JobFileError(
                f"{job_file.path}: [data] {key}: {feature!r}: drawn bags and per-id weights "
                f"need --data synthetic, not --data {a.data} (Criteo data is made multi-hot by "
                "--multi-hot-sizes; Parquet data brings its own bags and weights)"
            )
    return job_file.bags, job_file.weights


def check_rows_budget(a: argparse.Namespace, tables: JobTables | None) -> None:
    """A budget in rows counts rows of one width: refused for several tables."""
    if tables is not None and len(tables.tables) > 1 and a.ps_memory_rows:
        raise JobFileError(
            f"--ps-memory-rows with {len(tables.tables)} tables (--config {tables.source}): "
            "rows of different widths cost different memory; give the budget in bytes, "
            "--ps-memory-bytes N"
        )


def check_cache_tables(tables: JobTables | None) -> None:
    """The cache stage (``--read-mode bagpipe``) mirrors each table's SGD on its cached rows:
    every table of a job file must meet the cache row of the table of modes (SGD, no admission
    or expiry; ``cpu_dist.common.modes``)."""
    if tables is None:
        return
    for t in tables.tables:
        where = f'--read-mode bagpipe with --config {tables.source}: [[tables]] "{t.name}"'
        refused = modes.table_refusal("cache", t, where)
        if refused:
            raise JobFileError(refused)


# The flags that are the defaults of a job file's tables, and the table key each stands for.
TABLE_DEFAULT_FLAGS = (
    ("embedding_dim", "dim"),
    ("sparse_optimizer", "optimizer"),
    ("sparse_lr", "lr"),
    ("init_scale", "init_scale"),
    ("ps_admit_after", "admit_after"),
    ("ps_expire_after", "expire_after"),
)


def table_defaults_unused(a: argparse.Namespace, given: frozenset[str]) -> list[str]:
    """A table-default flag given where every table of the job file sets that key itself (a
    table's own keys are never overridden).  ``--embedding-dim`` still sets the model's width
    when the tables' widths differ, so it is named only when they are one."""
    job_file = getattr(a, "job_file", None)
    if job_file is None or not job_file.tables:
        return []
    entries = job_file.tables
    out = []
    for dest, key in TABLE_DEFAULT_FLAGS:
        if dest not in given or not all(key in t for t in entries):
            continue
        if key == "dim" and len({repr(t["dim"]) for t in entries}) > 1:
            continue
        flag = "--" + dest.replace("_", "-")
        out.append(f"{flag} has no effect: every table of --config {job_file.path} sets {key}")
    return out
