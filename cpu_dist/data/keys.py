"""Fused keys: the single source of truth for how (feature, id) becomes one int64 PS key.

The parameter server holds one table for every sparse feature, so each (feature, id) pair
must map to a distinct int64 key, identically in the data readers, the reference model and
any tool that inspects a dump. Every such mapping lives here and nowhere else.

Two layouts exist because the two data sources differ:

- Synthetic data has known, small cardinalities, so keys are dense:
  ``key = offset[f] + id`` with ``offset`` the exclusive cumulative sum of the
  cardinalities. Keys of feature f lie in ``[offset[f], offset[f] + card[f])``.
- Raw Criteo values are 32-bit hex strings of unknown cardinality, so keys carry the feature
  in the high bits: ``key = (f << 32) | (value % hash_size)``. With the default
  ``hash_size = 2**32`` an 8-digit Criteo value is kept as it is (no collisions at all);
  a smaller hash_size folds values modulo it (the "hashing trick", collisions accepted).
  hash_size may not exceed 2**32, or features would overlap.  The size may differ per feature
  (:func:`criteo_hash_sizes`: TorchRec's ``--num-embeddings-per-feature`` and DLRM's
  ``--max-ind-range``); every reader fuses through :func:`fuse_criteo_columns`, so the TSV
  reader and the converted layout (which stores the raw 32-bit values) give the same keys.

A job with a job file (``--config``) has named tables instead of the one fused table: each
table's keys are its features' own ids, taken back out of the fused keys by
:class:`TableKeySplit` (Criteo: the raw 32-bit value; synthetic: the fused key less the
feature's offset), modulo the table's ``num_embeddings`` where that is > 0.  The default job
keeps the fused keys as its one table ``embedding`` (today's bits).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

CRITEO_FEATURE_SHIFT = 32
CRITEO_DEFAULT_HASH_SIZE = 2**32
CRITEO_NUM_SPARSE = 26


def synthetic_offsets(cardinalities: Sequence[int]) -> np.ndarray:
    """Exclusive cumulative sum of the cardinalities: feature f's first key, int64 [F]."""
    card = np.asarray(cardinalities, dtype=np.int64)
    if card.ndim != 1 or card.size == 0 or np.any(card <= 0):
        raise ValueError(
            f"cardinalities must be a non-empty list of positive ints, got {cardinalities!r}"
        )
    return np.concatenate([[0], np.cumsum(card)[:-1]]).astype(np.int64)


def fuse_synthetic(ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``ids [B, F]`` (per-feature ids) -> fused keys ``[B, F]`` int64 via the offsets."""
    return np.asarray(ids, dtype=np.int64) + np.asarray(offsets, dtype=np.int64)[None, :]


def check_criteo_hash_size(hash_size: int) -> int:
    """Validate a Criteo hash size: ids must fit under the feature bits."""
    hash_size = int(hash_size)
    if not 0 < hash_size <= CRITEO_DEFAULT_HASH_SIZE:
        raise ValueError(f"hash_size must be in [1, 2**32], got {hash_size}")
    return hash_size


def fuse_criteo(
    feature: int | np.ndarray, value: int | np.ndarray, hash_size: int = CRITEO_DEFAULT_HASH_SIZE
):
    """Fused key of raw Criteo categorical value(s): ``(feature << 32) | (value % hash_size)``.

    ``value`` is the integer the hex string encodes (0 for a missing field, see the reader).
    Works on Python ints or int64 numpy arrays (broadcasting).
    """
    if isinstance(feature, (int, np.integer)) and isinstance(value, (int, np.integer)):
        return (int(feature) << CRITEO_FEATURE_SHIFT) | (int(value) % hash_size)
    f = np.asarray(feature, dtype=np.int64)
    v = np.asarray(value, dtype=np.int64) % np.int64(hash_size)
    return (f << np.int64(CRITEO_FEATURE_SHIFT)) | v


def criteo_feature_of(keys: np.ndarray) -> np.ndarray:
    """Inverse of the feature part of :func:`fuse_criteo` (for tools and tests)."""
    return np.asarray(keys, dtype=np.int64) >> np.int64(CRITEO_FEATURE_SHIFT)


def criteo_hash_sizes(
    num_embeddings_per_feature: Sequence[int] | None = None,
    max_ind_range: int | None = None,
    hash_size: int = CRITEO_DEFAULT_HASH_SIZE,
    num_sparse: int = CRITEO_NUM_SPARSE,
) -> tuple[int, ...]:
    """The hash size of each Criteo feature: the smallest of ``num_embeddings_per_feature[f]``
    (TorchRec's per-feature table sizes), ``max_ind_range`` (DLRM's single number, a cap on
    every table) and ``hash_size``; ``2**32`` (no folding) where none is given."""
    sizes = [check_criteo_hash_size(hash_size)] * num_sparse
    if num_embeddings_per_feature is not None:
        per = [int(n) for n in num_embeddings_per_feature]
        if len(per) != num_sparse:
            raise ValueError(
                f"num_embeddings_per_feature has {len(per)} entries, the data has "
                f"{num_sparse} sparse features"
            )
        sizes = [min(s, check_criteo_hash_size(n)) for s, n in zip(sizes, per)]
    if max_ind_range is not None:
        cap = check_criteo_hash_size(max_ind_range)
        sizes = [min(s, cap) for s in sizes]
    return tuple(sizes)


def fuse_criteo_columns(values: np.ndarray, hash_sizes: Sequence[int]) -> np.ndarray:
    """Raw Criteo values ``[n, F]`` (uint32 or int64, feature f in column f) -> fused keys
    ``[n, F]`` int64: ``(f << 32) | (value % hash_sizes[f])``, as :func:`fuse_criteo`."""
    v = np.asarray(values)
    sizes = np.asarray(hash_sizes, dtype=np.int64)
    if v.ndim != 2 or v.shape[1] != sizes.size:
        raise ValueError(f"values {v.shape} do not match {sizes.size} hash sizes")
    keys = v.astype(np.int64)
    if np.any(sizes != CRITEO_DEFAULT_HASH_SIZE):  # 2**32 leaves a 32-bit value as it is
        np.remainder(keys, sizes[None, :], out=keys)
    keys |= np.arange(sizes.size, dtype=np.int64)[None, :] << np.int64(CRITEO_FEATURE_SHIFT)
    return keys


CRITEO_VALUE_MASK = np.int64((1 << CRITEO_FEATURE_SHIFT) - 1)


def fold_ids(ids: np.ndarray, num_embeddings: int, *, out: np.ndarray | None = None) -> np.ndarray:
    """A table's rows of ids: ``id mod num_embeddings`` with the id taken as unsigned 64-bit
    (Parquet ids may be any 64-bit value; for ids >= 0 it is the plain remainder).  ``out``
    (an int64 array, ``ids`` itself allowed) receives the result."""
    u = np.asarray(ids, dtype=np.int64).view(np.uint64)
    target = None if out is None else out.view(np.uint64)
    return np.remainder(u, np.uint64(num_embeddings), out=target).view(np.int64)


class _TableLike(Protocol):
    """What :meth:`TableKeySplit.for_tables` reads of a table (``common.tables.TableConfig``)."""

    @property
    def name(self) -> str: ...
    @property
    def features(self) -> tuple[str, ...]: ...
    @property
    def num_embeddings(self) -> int: ...


class TableKeySplit:
    """Fused keys ``[B, F]`` -> ``{table: int64 [B, features of the table]}``, built once per job.

    ``columns[t]``: the data's feature index of each of table t's features, in the table's
    feature order (table t's keys column j is feature ``columns[t][j]``).  ``fused``: the one
    table of a job without a job file, whose keys are the fused keys themselves (no copy).
    ``offsets``: synthetic data's per-feature offsets (:func:`synthetic_offsets`); None for
    Criteo layouts, whose ids are the low 32 bits of the fused key.
    """

    def __init__(
        self,
        columns: Mapping[str, Sequence[int]],
        num_embeddings: Mapping[str, int] | None = None,
        offsets: np.ndarray | None = None,
        *,
        fused: bool = False,
    ) -> None:
        if not columns:
            raise ValueError("a job needs at least one table")
        self.columns = {name: np.asarray(c, dtype=np.int64) for name, c in columns.items()}
        self.num_embeddings = {name: int((num_embeddings or {}).get(name, 0)) for name in columns}
        self.offsets = None if offsets is None else np.asarray(offsets, dtype=np.int64)
        self.fused = fused
        if fused and len(columns) != 1:
            raise ValueError("a fused job has exactly one table")
        seen: dict[int, str] = {}
        for name, cols in self.columns.items():
            if cols.ndim != 1 or cols.size == 0:
                raise ValueError(f"table {name!r} has no features")
            for c in cols.tolist():
                if c in seen:
                    raise ValueError(f"feature {c} is in tables {seen[c]!r} and {name!r}")
                seen[c] = name
            if self.num_embeddings[name] < 0:
                raise ValueError(f"table {name!r}: num_embeddings must be >= 0")
        self.num_features = len(seen)
        if sorted(seen) != list(range(self.num_features)):
            raise ValueError(f"the tables' features {sorted(seen)} are not 0..F-1")

    @classmethod
    def for_tables(
        cls,
        tables: Sequence[_TableLike],
        feature_names: Sequence[str],
        offsets: np.ndarray | None = None,
        *,
        fused: bool = False,
    ) -> TableKeySplit:
        """From the job's tables (their ``features`` by name) and the data's feature names."""
        index = {n: i for i, n in enumerate(feature_names)}
        columns: dict[str, list[int]] = {}
        for t in tables:
            missing = [f for f in t.features if f not in index]
            if missing:
                raise ValueError(
                    f"table {t.name!r}: feature {missing[0]!r} is not a feature of the data "
                    f"({', '.join(feature_names[:3])}, ...)"
                )
            columns[t.name] = [index[f] for f in t.features]
        return cls(columns, {t.name: t.num_embeddings for t in tables}, offsets, fused=fused)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.columns)

    def ids(self, keys: np.ndarray) -> np.ndarray:
        """Every feature's own id ``[B, F]`` from fused keys (no table's modulo)."""
        keys = np.asarray(keys, dtype=np.int64)
        if self.offsets is not None:
            return keys - self.offsets[None, :]
        return keys & CRITEO_VALUE_MASK

    def __call__(self, keys: np.ndarray) -> dict[str, np.ndarray]:
        keys = np.asarray(keys, dtype=np.int64)
        if keys.ndim != 2 or keys.shape[1] != self.num_features:
            raise ValueError(f"keys {keys.shape}: expected [B, {self.num_features}]")
        if self.fused:
            return {self.names[0]: keys}
        ids = self.ids(keys)
        out = {}
        for name, cols in self.columns.items():
            part = np.ascontiguousarray(ids[:, cols])
            n = self.num_embeddings[name]
            if n > 0:
                fold_ids(part, n, out=part)
            out[name] = part
        return out


def table_keys(
    keys: np.ndarray,
    tables: Sequence[_TableLike],
    feature_names: Sequence[str],
    offsets: np.ndarray | None = None,
    *,
    fused: bool = False,
) -> dict[str, np.ndarray]:
    """One batch's fused keys ``[B, F]`` as each table's keys (see :class:`TableKeySplit`;
    build that once where many batches are split)."""
    return TableKeySplit.for_tables(tables, feature_names, offsets, fused=fused)(keys)
