"""The data flags' checks that need the data's own shape: Criteo made multi-hot
(``--multi-hot-sizes``) and Parquet's columns (``--data parquet``, read from the first file's
schema, so that a table naming a column the files lack is refused before any rank starts).

Every refusal is a ValueError (``validate`` reports it as a ConfigError) naming the flag or
the job file's key, and for Parquet the file and the column.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from cpu_dist.common.job_file_checks import job_file_of
from cpu_dist.common.parquet_schema import (
    ParquetColumns,
    check_files,
    check_schema,
    parquet_files,
    read_schema,
    resolve_columns,
)

_CRITEO_SPARSE = 26
# MLPerf DLRM-DCNv2's per-feature bag sizes for Criteo's 26 features (214 ids a sample).
MLPERF_SIZES = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
MAX_SIZE = 1 << 16


def parse_sizes(spec: str, num_features: int, flag: str = "--multi-hot-sizes") -> tuple[int, ...]:
    """``"3,2,1,..."`` -> one bag size per feature; a ValueError naming ``flag`` otherwise."""
    try:
        sizes = tuple(int(x) for x in spec.split(","))
    except ValueError:
        raise ValueError(
            f"{flag} {spec!r}: expected {num_features} integers joined by ','"
        ) from None
    return check_sizes(sizes, num_features, flag)


def check_sizes(sizes: Sequence[int], num_features: int, flag: str) -> tuple[int, ...]:
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) != num_features:
        raise ValueError(
            f"{flag}: {len(sizes)} sizes given, the data has {num_features} sparse features"
        )
    bad = [(f, s) for f, s in enumerate(sizes) if not 1 <= s <= MAX_SIZE]
    if bad:
        f, s = bad[0]
        raise ValueError(f"{flag}: feature {f}'s size {s}: must be in [1, {MAX_SIZE}]")
    return sizes


def multi_hot_sizes(a: argparse.Namespace) -> tuple[int, ...] | None:
    """``--multi-hot-sizes`` as one size per Criteo feature ('mlperf': MLPerf's), or None."""
    spec = getattr(a, "multi_hot_sizes", None)
    if spec is None:
        return None
    if a.data not in ("criteo", "criteo-bin"):
        raise ValueError(
            f"--multi-hot-sizes: makes Criteo data multi-hot (--data criteo or criteo-bin), not "
            f"--data {a.data} ("
            + (
                "Parquet's list<int64> columns are its bags"
                if a.data == "parquet"
                else "the synthetic stream's bags are a job file's [data] bags"
            )
            + ")"
        )
    if spec.strip().lower() == "mlperf":
        return MLPERF_SIZES
    return parse_sizes(spec, _CRITEO_SPARSE)


@dataclass(frozen=True)
class ParquetSchema:
    """What validation learned of a Parquet input: the columns a table may name (every column
    but the label, the dense and the weight columns) and the job file's column keys."""

    candidates: tuple[str, ...]
    label: str
    dense: tuple[str, ...] | None
    weights: dict[str, str]


def parquet_schema(a: argparse.Namespace) -> ParquetSchema:
    """``--data parquet``'s first file's columns, with the job file's ``[data]`` keys."""
    if not a.data_path:
        raise ValueError("--data parquet needs --data-path FILE_OR_DIR (or [data] path)")
    job_file = job_file_of(a)
    section = job_file.data if job_file is not None else None
    label = (section.label if section is not None else None) or "label"
    dense = section.dense if section is not None else None
    weights = dict(section.weight_columns) if section is not None else {}
    schema = read_schema(a.data_path)
    taken = {label, *(dense or ()), *weights.values()}
    return ParquetSchema(tuple(n for n in schema.names if n not in taken), label, dense, weights)


def parquet_columns(
    a: argparse.Namespace, schema: ParquetSchema, features: tuple[str, ...] | None
) -> ParquetColumns:
    """The columns the job reads (``features``: the job file's tables', None: every integer
    column), checked against every file's footer (:func:`check_files`: columns, types and
    weights as many as ids); the rows are checked as they are decoded."""
    first = parquet_files(a.data_path)[0]
    arrow = read_schema(first)
    missing = [f for f in schema.weights if features is not None and f not in features]
    if missing:
        raise ValueError(f"[data] weights: {missing[0]!r} is not a feature of the job's tables")
    cols = resolve_columns(
        arrow,
        label=schema.label,
        dense=schema.dense,
        features=features,
        weights=schema.weights,
        where=f"{first}: ",
    )
    check_schema(first, arrow, cols)
    check_files(a.data_path, cols)  # every file's footer: before any rank trains
    if not cols.features:
        raise ValueError(
            f"{first}: no integer or list<int64> column to train on (a feature reads the "
            "column of its name)"
        )
    unknown = [f for f in schema.weights if f not in cols.features]
    if unknown:
        raise ValueError(f"[data] weights: {unknown[0]!r} is not a feature of {first}")
    return cols
