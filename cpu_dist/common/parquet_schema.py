"""What a Parquet input's schema says (``--data parquet``): its files, the columns a job reads
and whether their types can be trained on.  Here, below the data readers, so that the flags'
checks (``data_checks``) refuse a table naming a column the files lack before any rank
starts; ``cpu_dist.data.parquet`` reads the rows."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

SUFFIXES = (".parquet", ".parq")


class ParquetError(ValueError):
    """A Parquet input that cannot be trained on; the message names the file, column, row."""


def parquet_files(path: str | os.PathLike) -> list[Path]:
    """The files of ``path``: itself, or a directory's Parquet files sorted by name."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix in SUFFIXES and f.is_file())
        if not files:
            raise ParquetError(f"{p}: no Parquet files ({', '.join(SUFFIXES)}) in the directory")
        return files
    if not p.is_file():
        raise ParquetError(f"{p}: no such file or directory")
    return [p]


def _is_int(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


def _is_int_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_int(t.value_type)


def _is_float_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_floating(t.value_type)


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def read_schema(path: str | os.PathLike) -> pa.Schema:
    """The first file's schema (the columns a job's validation checks names against)."""
    first = parquet_files(path)[0]
    try:
        return pq.read_schema(first)
    except (OSError, pa.ArrowException) as exc:
        raise ParquetError(f"{first}: not a readable Parquet file: {exc}") from None


@dataclass(frozen=True)
class ParquetColumns:
    """Which columns a job reads: ``features`` (categorical, in the file's column order),
    ``dense``, ``label`` and ``weights`` (``{feature: column}``)."""

    features: tuple[str, ...]
    dense: tuple[str, ...]
    label: str
    weights: Mapping[str, str]


def resolve_columns(
    schema: pa.Schema,
    *,
    label: str = "label",
    dense: Sequence[str] | None = None,
    features: Sequence[str] | None = None,
    weights: Mapping[str, str] | None = None,
    where: str = "",
) -> ParquetColumns:
    """The job's columns from a file's schema: ``features`` None: every integer or
    ``list<integer>`` column but the label (else those named, put in the file's order);
    ``dense`` None: every float column but the label."""
    names = list(schema.names)
    weights = dict(weights or {})
    taken = {label, *weights.values()}
    if features is None:
        feats = [
            n
            for n in names
            if n not in taken
            and (_is_int(schema.field(n).type) or _is_int_list(schema.field(n).type))
        ]
    else:
        order = {n: i for i, n in enumerate(names)}
        missing = [f for f in features if f not in order]
        if missing:
            raise ParquetError(
                f"{where}column {missing[0]!r}: missing (a table's feature reads the column of "
                f"its name; the file has {', '.join(names[:8])}{' ...' if len(names) > 8 else ''})"
            )
        feats = sorted(features, key=order.__getitem__)
    if dense is None:
        den = [
            n
            for n in names
            if n not in taken and n not in feats and pa.types.is_floating(schema.field(n).type)
        ]
    else:
        den = list(dense)
    return ParquetColumns(tuple(feats), tuple(den), label, weights)


def check_schema(file: Path, schema: pa.Schema, cols: ParquetColumns) -> None:
    """Every column the job reads is in ``file`` with a type it can take."""

    def want(name: str, ok: bool, what: str) -> None:
        if name not in schema.names:
            raise ParquetError(f"{file}: column {name!r}: missing ({what})")
        if not ok:
            raise ParquetError(
                f"{file}: column {name!r}: type {schema.field(name).type}, expected {what}"
            )

    def typ(name: str) -> pa.DataType:
        return schema.field(name).type if name in schema.names else pa.null()

    want(cols.label, _is_number(typ(cols.label)), "the label: an integer or float column of 0/1")
    for c in cols.dense:
        want(c, _is_number(typ(c)), "a dense feature: an integer or float column")
    for f in cols.features:
        t = typ(f)
        want(f, _is_int(t) or _is_int_list(t), "a feature's ids: int64 or list<int64>")
    for f, c in cols.weights.items():
        want(c, _is_float_list(typ(c)), f"feature {f!r}'s weights: list<float>")


def _leaf_values(group: pq.RowGroupMetaData, name: str) -> int | None:
    """The values (level entries: an empty list counts one) column ``name`` holds in a row
    group, from the footer alone; None when no leaf of that name is found."""
    for j in range(group.num_columns):
        chunk = group.column(j)
        path = chunk.path_in_schema
        if path == name or path.startswith(name + "."):
            return int(chunk.num_values)
    return None


def _row_lengths(column: pa.ChunkedArray) -> np.ndarray:
    """Each row's number of values: a list's length (0 for a null list), 1 for a scalar."""
    arr = column.combine_chunks()
    if isinstance(arr, (pa.ListArray, pa.LargeListArray)):
        return np.asarray(arr.value_lengths().fill_null(0).to_numpy(zero_copy_only=False))
    return np.ones(len(arr), dtype=np.int64)


def check_weight_lengths(
    file: Path,
    feature: str,
    column: str,
    id_len: np.ndarray,
    w_len: np.ndarray,
    first: int,
) -> None:
    """Every row holds as many weights as ids, else ParquetError naming the file, the weights
    column, the first such row (``first``: the file's row of this slice's first) and the
    feature: the one check (and message) of the flags' footer pass and of the loader."""
    wrong = np.flatnonzero(id_len != w_len)
    if wrong.size:
        r = int(wrong[0])
        raise ParquetError(
            f"{file}: column {column!r}: row {first + r}: {int(w_len[r])} weights for "
            f"{int(id_len[r])} ids of feature {feature!r}"
        )


def check_weight_counts(file: Path, reader: pq.ParquetFile, cols: ParquetColumns) -> None:
    """Every weighted feature's weights as many as its ids, row group by row group, from the
    footer's value counts (no row is read): a group whose counts differ has a row whose
    weights list is not as long as its ids, which is then decoded (that group's two columns
    alone) to name the row.  Why here: found while the job starts, before training, instead of
    mid-run once checkpoints were written.  Counts that agree can still hide a row that
    differs (a list of one against an empty one); the reader's check of every slice finds it."""
    meta, first = reader.metadata, 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for feature, column in cols.weights.items():
            ids, weights = _leaf_values(group, feature), _leaf_values(group, column)
            if ids is None or weights is None or ids == weights:
                continue
            try:
                table = reader.read_row_group(g, columns=[feature, column], use_threads=False)
            except (OSError, pa.ArrowException) as exc:
                raise ParquetError(
                    f"{file}: columns {feature!r}, {column!r}: row group {g}: {exc}"
                ) from None
            check_weight_lengths(
                file,
                feature,
                column,
                _row_lengths(table.column(feature)),
                _row_lengths(table.column(column)),
                first,
            )
        first += group.num_rows


def check_file(file: Path, cols: ParquetColumns, reader: pq.ParquetFile | None = None) -> None:
    """What ``file``'s footer can tell before any row is read: the columns the job reads and
    their types (:func:`check_schema`), and each weighted feature's weights as many as its
    ids (:func:`check_weight_counts`)."""
    if reader is None:
        try:
            reader = pq.ParquetFile(file, memory_map=True)
        except (OSError, pa.ArrowException) as exc:
            raise ParquetError(f"{file}: not a readable Parquet file: {exc}") from None
    check_schema(file, reader.schema_arrow, cols)
    check_weight_counts(file, reader, cols)


def check_files(path: str | os.PathLike, cols: ParquetColumns) -> None:
    """:func:`check_file` of every file of ``path``: the flags' checks run it, so that a file
    after the first that the job cannot read is one line and exit 2 before anything starts."""
    for file in parquet_files(path):
        check_file(file, cols)
