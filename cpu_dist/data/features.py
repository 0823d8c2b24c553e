"""A batch's categorical features as the model sees them: one ``KeyedJaggedTensor``.

The data readers give fused keys ``[B, F]`` (one id per feature, :mod:`cpu_dist.data.keys`)
and, for multi-hot features, bags (``Batch.bags``).  :class:`BatchFeatures` turns them into
the ``KeyedJaggedTensor`` a model's ``forward(dense, sparse)`` takes, keyed by the data's
feature names, each feature's values in its table's key space:

- the default job's one fused table (``JobTables.fused``): the fused keys themselves, so its
  26 features never share a row and its keys stay today's;
- a job file's tables: each feature's own ids (:class:`~cpu_dist.data.keys.TableKeySplit`),
  modulo the table's ``num_embeddings`` where that is > 0; a bag's ids likewise.

The one conversion the job's loader, its evaluation, the single-process reference and serving
use, so that all four feed a model the same ids.  This module imports torch (the rest of
``cpu_dist.data`` does not).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from cpu_dist.common.tables import JobTables
from cpu_dist.data.batch import Batch
from cpu_dist.data.keys import TableKeySplit, fold_ids, fuse_criteo
from cpu_dist.embeddings import KeyedJaggedTensor

__all__ = ["BatchFeatures", "key_split"]


def key_split(tables: JobTables, kind: str, offsets: np.ndarray | None) -> TableKeySplit:
    """How a job's batches become each table's keys: the default job's one fused table keeps
    the fused keys; a job file's tables take their features' own ids (synthetic data: the
    fused key less the feature's ``offsets``)."""
    if tables.fused:
        return TableKeySplit(
            {t.name: range(len(tables.data_features)) for t in tables.tables}, fused=True
        )
    return TableKeySplit.for_tables(
        tables.tables, tables.data_features, offsets if kind == "synthetic" else None
    )


class BatchFeatures:
    """``Batch -> KeyedJaggedTensor`` for one job's tables and data (see the module docstring).

    Args:
        tables: the job's tables (``cfg.tables``): their features, in the data's order
            (``data_features``), are the output's keys.
        kind: the data's kind (``cfg.data.kind``).
        offsets: synthetic data's per-feature key offsets (``SyntheticCriteo.offsets``).

    Example::

        features = BatchFeatures(cfg.tables, dataset.kind, getattr(dataset, "offsets", None))
        logits = model(torch.from_numpy(batch.dense), features(batch))
    """

    def __init__(self, tables: JobTables, kind: str, offsets: np.ndarray | None = None) -> None:
        self.tables = tables
        self.split = key_split(tables, kind, offsets)
        self._kind = kind
        self._offsets = None if offsets is None else np.asarray(offsets, dtype=np.int64)
        self.names: tuple[str, ...] = tuple(tables.data_features)
        modulo = [0] * len(self.names)
        if not tables.fused:
            for t in tables.tables:
                for f in t.features:
                    modulo[self.names.index(f)] = int(t.num_embeddings)
        self._modulo = modulo

    def _fuse(self, f: int, ids: np.ndarray) -> np.ndarray:
        """Feature ``f``'s own ids as the fused table's keys (:mod:`cpu_dist.data.keys`)."""
        if self._kind == "synthetic":
            assert self._offsets is not None
            return ids + self._offsets[f]
        return fuse_criteo(f, ids)

    def ids(self, batch: Batch) -> np.ndarray:
        """Every feature's one-hot ids ``[F, B]`` in its table's key space (feature-major)."""
        if self.split.fused:
            return np.ascontiguousarray(np.asarray(batch.keys, dtype=np.int64).T)
        ids = np.ascontiguousarray(self.split.ids(batch.keys).T)
        for f, n in enumerate(self._modulo):
            if n > 0:
                fold_ids(ids[f], n, out=ids[f])
        return ids

    def __call__(self, batch: Batch) -> KeyedJaggedTensor:
        bags = getattr(batch, "bags", None) or {}
        unknown = [f for f in bags if f not in self.names]
        if unknown:
            raise KeyError(
                f"the batch has bags of feature {unknown[0]!r}, which no table of the job serves"
            )
        ids = self.ids(batch)
        b = len(batch)
        if not bags:  # one id per feature per sample: lengths all 1
            return KeyedJaggedTensor(
                list(self.names),
                torch.from_numpy(ids.reshape(-1)),
                lengths=torch.ones(len(self.names) * b, dtype=torch.int64),
            )
        weighted = any(bag.weights is not None for bag in bags.values())
        values: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        weights: list[np.ndarray] = []
        for f, name in enumerate(self.names):
            bag = bags.get(name)
            if bag is None:
                values.append(ids[f])
                lengths.append(np.ones(b, dtype=np.int64))
                if weighted:
                    weights.append(np.ones(b, dtype=np.float32))
                continue
            v = np.asarray(bag.values, dtype=np.int64)
            if self.split.fused:  # the one fused table: the feature's fused keys
                v = self._fuse(f, v)
            elif self._modulo[f] > 0:
                v = fold_ids(v, self._modulo[f])
            values.append(v)
            lengths.append(np.asarray(bag.lengths, dtype=np.int64))
            if weighted:
                w = bag.weights
                weights.append(
                    np.ones(len(v), dtype=np.float32) if w is None else np.asarray(w, np.float32)
                )
        return KeyedJaggedTensor(
            list(self.names),
            torch.from_numpy(_join(values, np.int64)),
            weights=torch.from_numpy(_join(weights, np.float32)) if weighted else None,
            lengths=torch.from_numpy(_join(lengths, np.int64)),
        )


def _join(parts: Sequence[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
