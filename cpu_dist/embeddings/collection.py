"""``EmbeddingBagCollection``: TorchRec's module that turns a ``KeyedJaggedTensor`` into
pooled features (a ``KeyedTensor``), one table per :class:`EmbeddingBagConfig`.

The rows are not torch parameters: they come from the collection's row source
(:mod:`cpu_dist.embeddings.rows`), local and lazy outside a job, the parameter server's pulled
rows inside one, so ``model.parameters()`` holds the dense part only (what a dense optimizer
and the all-reduce see) and a 40M-row table costs only the rows a run touches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cpu_dist.embeddings.config import EmbeddingBagConfig, pooling_type
from cpu_dist.embeddings.foreign import our_fields
from cpu_dist.embeddings.jagged import KeyedJaggedTensor, as_keyed_jagged
from cpu_dist.embeddings.keyed import KeyedTensor
from cpu_dist.embeddings.pooling import pool_bags
from cpu_dist.embeddings.rows import LocalRows, RowSource

__all__ = [
    "EmbeddingBagCollection",
    "collections_of",
    "sparse_step",
    "table_ids",
    "table_ids_of",
    "unique_ids",
]


def _as_config(table: object, index: int) -> EmbeddingBagConfig:
    """Ours as it is; TorchRec's own ``EmbeddingBagConfig`` from its fields, and ours (the
    optimizer, lr, ...) from the job building the model (``foreign.our_fields``)."""
    if isinstance(table, EmbeddingBagConfig):
        return table
    fields = ("num_embeddings", "embedding_dim", "name", "feature_names")
    if not all(hasattr(table, f) for f in fields):
        raise TypeError(
            f"tables[{index}]: expected an EmbeddingBagConfig, got {type(table).__name__}"
        )
    return EmbeddingBagConfig(
        num_embeddings=table.num_embeddings,  # type: ignore[attr-defined]
        embedding_dim=table.embedding_dim,  # type: ignore[attr-defined]
        name=table.name,  # type: ignore[attr-defined]
        feature_names=tuple(table.feature_names),  # type: ignore[attr-defined]
        weight_init_max=getattr(table, "weight_init_max", None),
        weight_init_min=getattr(table, "weight_init_min", None),
        pooling=pooling_type(getattr(table, "pooling", "sum"), f"tables[{index}]"),
        **our_fields(table.name),  # type: ignore[attr-defined, arg-type]
    )


def table_ids(values: torch.Tensor, table: EmbeddingBagConfig, feature: str) -> np.ndarray:
    """A feature's ids as its table's int64 keys: raw (negative ones read as unsigned, as
    ``row_init`` and the shards take them) where ``num_embeddings`` is 0, else checked to lie
    in ``[0, num_embeddings)`` (TorchRec's contract; a job's data side folds them modulo)."""
    if values.is_floating_point() or values.dtype == torch.bool:
        raise TypeError(f"feature {feature!r}: ids must be integers, got {values.dtype}")
    ids = values.to(torch.int64).numpy()
    n = table.num_embeddings
    if n > 0 and len(ids):
        bad = np.flatnonzero((ids < 0) | (ids >= n))
        if len(bad):
            raise ValueError(
                f"feature {feature!r}: id {int(ids[bad[0]])} is outside table "
                f"{table.name!r}'s [0, {n}) (num_embeddings {n}; 0 takes raw ids)"
            )
    return ids


def unique_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(sorted unique ids, int64 inverse [n])``: a table's rows to read and each id's row."""
    unique, inverse = np.unique(ids, return_inverse=True)
    return unique, inverse.reshape(-1).astype(np.int64, copy=False)


def table_ids_of(
    features: KeyedJaggedTensor, tables: Sequence[EmbeddingBagConfig]
) -> dict[str, np.ndarray]:
    """Per table, its features' ids of a batch as int64 keys, feature after feature in the
    table's ``feature_names`` order (each feature's bags key-major): what a collection looks
    up, and what a job's loader plans ahead (:func:`unique_ids`) for the rows to pull."""
    kjt = as_keyed_jagged(features)
    values, start = kjt.values(), kjt.offset_per_key()
    index = {k: i for i, k in enumerate(kjt.keys())}
    out: dict[str, np.ndarray] = {}
    for table in tables:
        parts = []
        for f in table.feature_names:
            if f not in index:
                raise KeyError(f"feature {f!r} is not in the KeyedJaggedTensor")
            k = index[f]
            parts.append(table_ids(values[start[k] : start[k + 1]], table, f))
        out[table.name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return out


class EmbeddingBagCollection(nn.Module):
    """Pooled embeddings of several tables: ``forward(KeyedJaggedTensor) -> KeyedTensor``.

    Each table pools the bags of each of its ``feature_names`` with its ``pooling``; features
    that share a table share its rows.  The output's keys are the features, table by table in
    ``tables`` order, each table's in its ``feature_names`` order (TorchRec's), each as wide
    as its table.  The input may hold its keys in any order and more keys than the tables
    serve (ignored); a feature a table serves but the input lacks is an error naming it.

    Outside a job the rows are local (:class:`~cpu_dist.embeddings.rows.LocalRows`): created
    at first touch from ``contracts.row_init`` exactly as a shard creates them, and trained by
    :meth:`sparse_step` with each table's optimizer (``contracts.sparse_update``, the shard's
    arithmetic), so the model is its own single-process reference.  Building one consumes no
    torch random numbers, so a model's dense init is the same inside and outside a job.

    Args:
        tables: the tables (:class:`EmbeddingBagConfig`, or TorchRec's own), unique names,
            each feature in one table only.
        is_weighted: None (default): ids are weighted by the input's weights where it has
            them; True: the input must carry weights; False: weights are ignored (TorchRec's
            ``is_weighted=False``).
        device: None or the CPU (the framework trains on CPUs).
        seed: ``row_init``'s seed for tables whose config has none (a job's ``--seed``).

    Example::

        ebc = EmbeddingBagCollection([
            EmbeddingBagConfig(0, 8, "items", feature_names=["clicked", "bought"]),
            EmbeddingBagConfig(100, 4, "query", feature_names=["query"], pooling="mean"),
        ])
        kt = ebc(kjt)                  # kt.keys() == ["clicked", "bought", "query"]
        loss = model_head(kt.values()).sum()
        loss.backward()
        ebc.sparse_step()              # each table's optimizer on the rows the step used
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        is_weighted: bool | None = None,
        device: torch.device | str | None = None,
        *,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"EmbeddingBagCollection: device {device!r}: only the CPU")
        if isinstance(tables, EmbeddingBagConfig) or not len(tables):
            raise ValueError("EmbeddingBagCollection: tables must be a non-empty list")
        configs = [_as_config(t, i) for i, t in enumerate(tables)]
        owner: dict[str, str] = {}
        names: set[str] = set()
        for c in configs:
            if c.name in names:
                raise ValueError(f"EmbeddingBagCollection: two tables are named {c.name!r}")
            names.add(c.name)
            for f in c.feature_names:
                if f in owner:
                    raise ValueError(
                        f"EmbeddingBagCollection: feature {f!r} is in table {owner[f]!r} and "
                        f"in {c.name!r} (one table per feature; share a table instead)"
                    )
                owner[f] = c.name
        self._configs = configs
        self._is_weighted = is_weighted
        self._embedding_names = [f for c in configs for f in c.feature_names]
        self._widths = [c.embedding_dim for c in configs for _ in c.feature_names]
        seeds = {c.name: seed if c.seed is None else c.seed for c in configs}
        self._rows: RowSource = LocalRows(configs, seeds)

    # TorchRec's accessors.
    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return list(self._configs)

    def is_weighted(self) -> bool | None:
        return self._is_weighted

    def embedding_names(self) -> list[str]:
        """The output's keys in order."""
        return list(self._embedding_names)

    @property
    def row_source(self) -> RowSource:
        return self._rows

    def set_row_source(self, source: RowSource) -> None:
        """Where rows come from from now on (a job swaps in the PS-fed source here)."""
        if not isinstance(source, RowSource):
            raise TypeError(f"{type(source).__name__} is not a RowSource (no lookup())")
        self._rows = source

    def _plan(self, table: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(sorted unique ids, inverse [n])`` of a table's ids: the row source's own plan
        where it has one (a job's source holds the plan the loader made ahead and checks that
        it is this one), else ``np.unique``."""
        plan = getattr(self._rows, "plan", None)
        if plan is not None:
            return plan(table, ids)
        return unique_ids(ids)

    def _weights_of(self, kjt: KeyedJaggedTensor) -> torch.Tensor | None:
        weights = kjt.weights_or_none()
        if self._is_weighted is False:
            return None
        if self._is_weighted and weights is None:
            raise ValueError(
                "EmbeddingBagCollection(is_weighted=True): the KeyedJaggedTensor has no weights"
            )
        return weights

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Pool every table's features of ``features`` (ours, TorchRec's, or any object with
        ``keys()``, ``values()``, ``lengths()``, ``weights_or_none()``).

        Args:
            features: one batch, key-major, ``stride()`` samples.

        Returns:
            ``KeyedTensor`` of ``[stride, sum of the features' widths]``.
        """
        kjt = as_keyed_jagged(features)
        present = set(kjt.keys())
        missing = [f for f in self._embedding_names if f not in present]
        if missing:
            raise KeyError(
                f"feature {missing[0]!r} is not in the KeyedJaggedTensor (its keys: "
                f"{', '.join(kjt.keys()) or 'none'})"
            )
        weights = self._weights_of(kjt)
        lengths, stride = kjt.lengths(), kjt.stride()
        start, index = kjt.offset_per_key(), {k: i for i, k in enumerate(kjt.keys())}
        ids = table_ids_of(kjt, self._configs)
        pooled: list[torch.Tensor] = []
        for table in self._configs:
            unique, inverse = self._plan(table.name, ids[table.name])
            rows = self._rows.lookup(table.name, unique)
            if tuple(rows.shape) != (len(unique), table.embedding_dim):
                raise ValueError(
                    f"table {table.name!r}: the row source gave {tuple(rows.shape)}, expected "
                    f"({len(unique)}, {table.embedding_dim})"
                )
            inverse_t = torch.from_numpy(inverse)
            names = table.feature_names
            mine = torch.tensor([index[f] for f in names], dtype=torch.int64)
            if weights is None and stride and bool((lengths.view(-1, stride)[mine] == 1).all()):
                # every bag of the table holds one id (one-hot features: Criteo's, the default
                # DLRM's): one lookup for all of them in sample-major order (the index is
                # transposed, not the rows), which gives [B, F_t * d] without a copy and sums
                # a row's gradient over its uses in the order the one-hot embedding always had
                index_bf = inverse_t.view(len(names), stride).t().reshape(-1)
                looked = F.embedding(index_bf, rows)
                pooled.append(looked.view(stride, len(names) * table.embedding_dim))
                continue
            at = 0
            for f in names:
                k = index[f]
                n = start[k + 1] - start[k]
                offsets = torch.zeros(stride + 1, dtype=torch.int64)
                torch.cumsum(lengths[k * stride : (k + 1) * stride], 0, out=offsets[1:])
                w = None if weights is None else weights[start[k] : start[k + 1]]
                pooled.append(
                    pool_bags(rows, inverse_t[at : at + n], offsets, w, table.pooling.mode)
                )
                at += n
        values = pooled[0] if len(pooled) == 1 else torch.cat(pooled, 1)
        return KeyedTensor(self._embedding_names, self._widths, values)

    def sparse_step(self, lr: float | Mapping[str, float] | None = None) -> dict[str, int]:
        """Train the local rows: each table's optimizer (``contracts.sparse_update``) on the
        rows the forwards since the last step used, with the gradients ``backward()`` left
        on them (summed per id).  Call it beside the dense optimizer's ``step()``.

        Args:
            lr: one learning rate for every table, or one per table name (a schedule's
                rates); default: each table's ``lr``.

        Returns:
            The number of rows updated, per table.
        """
        step = getattr(self._rows, "sparse_step", None)
        if step is None:
            raise RuntimeError(
                "this collection's rows are not local (a job's parameter server updates them)"
            )
        return step(lr)

    def zero_sparse_grad(self) -> None:
        """Drop the rows handed out since the last :meth:`sparse_step` without updating them."""
        clear = getattr(self._rows, "zero_grad", None)
        if clear is not None:
            clear()

    def table_rows(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per table, the local rows held: (sorted ids int64 [n], float32 rows [n, dim])."""
        if not isinstance(self._rows, LocalRows):
            raise RuntimeError("this collection's rows are not local")
        return {n: (t.ids.copy(), t.rows) for n, t in self._rows.tables.items()}

    # The local rows in state_dict(), so that torch.save(model.state_dict()) keeps them:
    # ``embedding_bags.<table>.ids`` / ``.weight`` / ``.optimizer_state`` (TorchRec's prefix;
    # ids, since a lazy table holds only touched rows), and for a table with admission or
    # expiry its rules' counters (``LazyTable.array_names``).  A source that is not local (a
    # job's parameter server) holds its rows itself, and nothing is saved here.

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if isinstance(self._rows, LocalRows):
            for name, table in self._rows.tables.items():
                for key, array in table.arrays().items():
                    destination[f"{prefix}embedding_bags.{name}.{key}"] = torch.from_numpy(array)

    def _load_from_state_dict(
        self,
        state_dict: Any,
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        errors: list[str],
    ) -> None:
        mine = f"{prefix}embedding_bags."
        if isinstance(self._rows, LocalRows):
            loads, refused, incomplete = [], [], False
            for name, table in self._rows.tables.items():
                keys = {k: f"{mine}{name}.{k}" for k in table.array_names()}
                absent = [full for full in keys.values() if full not in state_dict]
                if absent:
                    missing_keys.extend(absent)
                    incomplete = True
                    continue
                arrays = {k: state_dict[full].numpy() for k, full in keys.items()}
                try:
                    table.check(arrays)
                except ValueError as exc:
                    refused.append(str(exc))
                loads.append((table, arrays))
            errors.extend(refused)
            # every table is checked first: none is loaded when one is refused (or, strict,
            # when one is missing), as load_state_dict then raises
            if not refused and not (strict and incomplete):
                for table, arrays in loads:
                    table.load(arrays)
            known = {
                f"{mine}{n}.{k}" for n, t in self._rows.tables.items() for k in t.array_names()
            }
            unexpected_keys.extend(k for k in state_dict if k.startswith(mine) and k not in known)
        rest = {k: v for k, v in state_dict.items() if not k.startswith(mine)}
        super()._load_from_state_dict(
            rest, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors
        )

    def extra_repr(self) -> str:
        return ", ".join(
            f"{c.name}: {c.embedding_dim}x{c.num_embeddings or 'raw'} {c.pooling.mode} "
            f"{list(c.feature_names)}"
            for c in self._configs
        )


def collections_of(model: nn.Module) -> list[tuple[str, EmbeddingBagCollection]]:
    """Every :class:`EmbeddingBagCollection` a model owns, however deep, as ``(qualified
    name, module)`` in ``named_modules`` order: what a job distributes (everything else is
    dense)."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, EmbeddingBagCollection)]


def sparse_step(
    model: nn.Module, lr: float | Mapping[str, float] | None = None
) -> dict[str, dict[str, int]]:
    """:meth:`EmbeddingBagCollection.sparse_step` on every collection of ``model`` (call it
    beside the dense optimizer's ``step()``): ``{collection's qualified name: rows updated
    per table}``.

    Example::

        loss.backward()
        dense_optimizer.step()
        sparse_step(model)
    """
    return {name: ebc.sparse_step(lr) for name, ebc in collections_of(model)}
