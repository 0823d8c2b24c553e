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
  hash_size may not exceed 2**32, or features would overlap.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CRITEO_FEATURE_SHIFT = 32
CRITEO_DEFAULT_HASH_SIZE = 2**32


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
