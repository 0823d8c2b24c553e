"""The data section of the checks before training (``validate``): ``--data`` and the flags
that go with it become one :class:`~cpu_dist.common.config.DataConfig`, or a ConfigError that
names the flag (and, for Parquet, the file and the column)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from cpu_dist.common.config import DataConfig
from cpu_dist.common.config_errors import ConfigError, as_config_error
from cpu_dist.common.data_checks import multi_hot_sizes, parquet_columns, parquet_schema
from cpu_dist.common.features import CATEGORICAL_FEATURES, MAX_NAMED_CARDINALITY, NAMED_CARDINALITY
from cpu_dist.common.job_file_checks import job_file_bags, job_file_of
from cpu_dist.common.parquet_schema import ParquetColumns
from cpu_dist.common.tables import JobTables


def _hash_sizes(a: argparse.Namespace) -> tuple[int, ...] | None:
    spec = a.num_embeddings_per_feature
    if spec is None:
        return None
    try:
        sizes = tuple(int(x) for x in spec.split(","))
    except ValueError:
        raise ConfigError(
            f"--num-embeddings-per-feature {spec!r}: expected 26 integers joined by ','"
        ) from None
    if len(sizes) != 26:
        raise ConfigError(
            f"--num-embeddings-per-feature: {len(sizes)} sizes given, Criteo has 26 features"
        )
    if any(not 0 < n <= 2**32 for n in sizes):
        raise ConfigError(f"--num-embeddings-per-feature {spec}: sizes must be in [1, 2**32]")
    return sizes


def _check_path(a: argparse.Namespace) -> None:
    """``--data-path`` is what its ``--data`` kind reads: a TSV file, a converted directory,
    Parquet files, or nothing."""
    if a.data == "criteo":
        if not a.data_path:
            raise ConfigError("--data criteo needs --data-path FILE")
        if os.path.isdir(a.data_path):
            hint = (
                " (a converted directory: --data criteo-bin)"
                if os.path.isfile(os.path.join(a.data_path, "manifest.json"))
                else ""
            )
            raise ConfigError(
                f"--data-path {a.data_path}: is a directory; --data criteo reads one TSV file{hint}"
            )
        if not os.path.isfile(a.data_path):
            raise ConfigError(f"--data-path {a.data_path}: no such file")
    elif a.data == "criteo-bin":
        if not a.data_path:
            raise ConfigError("--data criteo-bin needs --data-path DIR")
        if os.path.isfile(a.data_path):
            raise ConfigError(
                f"--data-path {a.data_path}: is a file; --data criteo-bin reads a directory "
                "made by python -m cpu_dist.data.convert (a TSV file: --data criteo)"
            )
        if not os.path.exists(a.data_path):
            raise ConfigError(f"--data-path {a.data_path}: no such directory")
        if not os.path.isfile(os.path.join(a.data_path, "manifest.json")):
            raise ConfigError(
                f"--data-path {a.data_path}: no manifest.json (not a finished conversion: run "
                "python -m cpu_dist.data.convert INPUT... --output DIR)"
            )
    elif a.data == "parquet":
        if not a.data_path:
            raise ConfigError("--data parquet needs --data-path FILE_OR_DIR (or [data] path)")
        if not os.path.exists(a.data_path):
            raise ConfigError(f"--data-path {a.data_path}: no such file or directory")
    elif a.data_path:
        raise ConfigError("--data-path is only read with --data criteo, criteo-bin or parquet")


def _refuse_given(flags: Sequence[tuple[str, object]], why: str) -> None:
    """A ConfigError naming every flag of ``flags`` (flag, value) that was given (not None)."""
    given = [flag for flag, value in flags if value is not None]
    if given:
        raise ConfigError(f"{', '.join(given)}: {why}")


def _check_flags(a: argparse.Namespace) -> tuple[int, ...] | None:
    """The flags that only some kinds read, and their ranges; returns the hash sizes."""
    if a.skip_bad_lines and a.data == "criteo-bin":
        raise ConfigError(
            "--skip-bad-lines applies to --data criteo; give it to the converter instead"
        )
    sizes = _hash_sizes(a)
    if a.max_ind_range is not None and not 0 < a.max_ind_range <= 2**32:
        raise ConfigError(f"--max-ind-range {a.max_ind_range}: must be in [1, 2**32]")
    if a.epochs is not None and a.epochs < 1:
        raise ConfigError(f"--epochs {a.epochs}: must be >= 1")
    if a.data == "synthetic":
        _refuse_given(
            [
                ("--num-embeddings-per-feature", sizes),
                ("--max-ind-range", a.max_ind_range),
                ("--epochs", a.epochs),
                ("--shuffle", a.shuffle or None),
            ],
            "only for --data criteo or criteo-bin (the synthetic stream has its own key space "
            "and never ends)",
        )
    return sizes


def synthetic_shape(
    a: argparse.Namespace, tables: JobTables | None
) -> tuple[int, tuple[str, ...], tuple[tuple[str, int], ...]]:
    """Synthetic data's ``(num_dense, features, cardinalities)`` (``DataConfig``'s): the dense
    width (``[data] dense = N``, default 13), the job file's tables' features when they are not
    ``cat_0 ... cat_25`` in order, and each feature of another name with its cardinality
    (``[data] cardinalities``, else its table's ``num_embeddings``, else 100,000)."""
    job_file = job_file_of(a)
    section = job_file.data if job_file is not None else None
    width = DataConfig.num_dense
    if section is not None and section.dense_width is not None:
        width = section.dense_width
    given = dict(section.cardinalities) if section is not None else {}
    names = tables.data_features if tables is not None and not tables.fused else ()
    where = f"{job_file.path}: [data] cardinalities" if job_file is not None else ""
    for f in given:
        if f in CATEGORICAL_FEATURES:
            raise ConfigError(
                f"{where}: {f!r}: keeps the synthetic stream's own cardinality (cat_0 ... "
                "cat_25 are today's features); only features of other names take one"
            )
        if f not in names:
            raise ConfigError(f"{where}: {f!r} is in no table of the job")
    cards = []
    for f in names:
        if f in CATEGORICAL_FEATURES:
            continue
        assert tables is not None
        n = given.get(f) or tables.table_of(f).num_embeddings or NAMED_CARDINALITY
        if n > MAX_NAMED_CARDINALITY:
            source = "[data] cardinalities" if f in given else f"its table's num_embeddings {n}"
            raise ConfigError(
                f"--data synthetic: feature {f!r}: cardinality {n} ({source}) is over the "
                f"synthetic stream's {MAX_NAMED_CARDINALITY}; give it [data] cardinalities = "
                f"{{ {f} = N }} with N <= {MAX_NAMED_CARDINALITY}"
            )
        cards.append((f, int(n)))
    features = () if tuple(names) in ((), CATEGORICAL_FEATURES) else tuple(names)
    return width, features, tuple(sorted(cards))


def data_config(
    a: argparse.Namespace,
    data_features: Sequence[str] = CATEGORICAL_FEATURES,
    parquet: ParquetColumns | None = None,
    tables: JobTables | None = None,
) -> DataConfig:
    """The data section alone (tools that read the same batches as a job).  ``data_features``:
    the features a job file's ``[data]`` bags and weights may name (the job's tables');
    ``parquet``: Parquet data's columns (``data_checks.parquet_columns``; None: read here);
    ``tables``: the job file's tables (synthetic data makes their features)."""
    _check_path(a)
    sizes = _check_flags(a)
    with as_config_error():
        if a.data == "parquet" and parquet is None:
            parquet = parquet_columns(a, parquet_schema(a), None)
        if parquet is not None:
            data_features = parquet.features
        bags, weights = job_file_bags(a, data_features)
        sizes_mh = multi_hot_sizes(a)
    if a.data == "parquet":
        _refuse_given(
            [
                ("--skip-bad-lines", a.skip_bad_lines or None),
                ("--num-embeddings-per-feature", sizes),
                ("--max-ind-range", a.max_ind_range),
            ],
            "only for Criteo data (Parquet ids reach the tables as they are: give a job file's "
            "table its num_embeddings)",
        )
    width = DataConfig.num_dense
    named: tuple[str, ...] = ()
    cards: tuple[tuple[str, int], ...] = ()
    if a.data == "synthetic":
        width, named, cards = synthetic_shape(a, tables)
    return DataConfig(
        kind=a.data,
        path=a.data_path,
        skip_bad_lines=a.skip_bad_lines,
        zipf_exponent=a.zipf_exponent,
        num_embeddings_per_feature=sizes,
        max_ind_range=a.max_ind_range,
        epochs=_epochs(a),
        shuffle=a.shuffle,
        bags=bags,
        weights=weights,
        multi_hot_sizes=sizes_mh,
        multi_hot_distribution=a.multi_hot_distribution,
        features=parquet.features if parquet is not None else named,
        weight_columns=tuple(sorted(parquet.weights.items())) if parquet is not None else (),
        label=parquet.label if parquet is not None else DataConfig.label,
        dense=parquet.dense if parquet is not None else (),
        num_dense=width,
        cardinalities=cards,
    )


def _epochs(a: argparse.Namespace) -> int | None:
    """--epochs, else one pass, unless --max_step alone says how long to train (then the
    passes go on until it: None)."""
    if a.epochs is not None:
        return int(a.epochs)
    if a.data != "synthetic" and getattr(a, "max_step", None) is not None:
        return None
    return DataConfig.epochs
