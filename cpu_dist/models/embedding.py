"""An embedding layer whose rows live in an external store (the parameter server).

The rows are not torch parameters: each forward pulls the rows of the batch's unique keys,
wraps them in a leaf tensor that requires grad, and after backward the leaf's gradient is the
per-unique-key gradient the trainer pushes back to the store. Deduplicating before the pull
keeps the traffic at one row per distinct key, and summing the gradients of repeated keys is
exactly what autograd does for the indexing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class RowStore(Protocol):
    """Anything that returns rows for keys: ``cpu_dist.sparse.Client`` or a test dictionary."""

    def pull(self, keys: np.ndarray) -> np.ndarray: ...


class ShardedEmbedding(nn.Module):
    """Embedding lookup over ``store``; one id per bag, so ``[B, F]`` keys give ``[B, F, dim]``.

    ``dtype`` is the compute dtype of the output (float32 default; float64 casts the float32
    rows up, and :meth:`sparse_grads` casts the gradient back to float32 for the store).
    The state of the last forward (its keys and leaf rows) is kept until the next forward,
    so call :meth:`sparse_grads` after the backward of that forward.
    """

    def __init__(self, store: RowStore, dim: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self.store = store
        self.dim = int(dim)
        self.dtype = dtype
        self._keys: np.ndarray | None = None
        self._planned: tuple | None = None  # (keys, version, unique, inverse) of unique_keys()
        self._rows: torch.Tensor | None = None

    @staticmethod
    def _unique(keys: torch.Tensor, return_inverse: bool):
        if keys.dtype != torch.int64:
            raise TypeError(f"keys must be int64, got {keys.dtype}")
        return torch.unique(keys.reshape(-1), sorted=True, return_inverse=return_inverse)

    def unique_keys(self, keys: torch.Tensor | np.ndarray) -> np.ndarray:
        """The sorted unique keys a forward on ``keys`` will pull (so a trainer can pull ahead).

        The result is remembered for this very tensor (unless it is modified in place), so the
        forward that follows does not sort the batch's keys a second time."""
        keys = torch.as_tensor(keys)
        uniq, inverse = self._unique(keys, True)
        self._planned = (keys, keys._version, uniq, inverse)
        return uniq.numpy()

    @staticmethod
    def plan_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(sorted unique keys, inverse [keys.shape])`` as :meth:`unique_keys` computes them,
        in numpy so that a loader thread can do it ahead (see :meth:`use_plan`)."""
        if keys.dtype != np.int64:
            raise TypeError(f"keys must be int64, got {keys.dtype}")
        uniq, inverse = np.unique(keys.reshape(-1), return_inverse=True)
        return uniq, inverse.astype(np.int64, copy=False).reshape(-1)

    def use_plan(self, keys: torch.Tensor, plan: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """:meth:`unique_keys` from a :meth:`plan_keys` result made ahead for ``keys``."""
        uniq, inverse = plan
        self._planned = (keys, keys._version, torch.from_numpy(uniq), torch.from_numpy(inverse))
        return uniq

    def _unique_of(self, keys: torch.Tensor):
        planned = self._planned
        if planned is not None and planned[0] is keys and planned[1] == keys._version:
            return planned[2], planned[3]
        return self._unique(keys, True)

    def forward(
        self, keys: torch.Tensor, rows: torch.Tensor | np.ndarray | None = None
    ) -> torch.Tensor:
        """``keys [B, F]`` int64 -> ``[B, F, dim]`` in ``self.dtype``.

        ``rows``, if given, are the rows of exactly ``unique_keys(keys)`` in that order
        (already pulled by the caller); otherwise they are pulled from the store here.
        """
        keys = torch.as_tensor(keys)
        uniq, inverse = self._unique_of(keys)
        uniq_np = uniq.numpy()
        if rows is None:
            rows = self.store.pull(uniq_np)
        if isinstance(rows, np.ndarray):
            # A read-only buffer cannot be wrapped without a copy; a writable one is shared.
            rows = torch.from_numpy(rows if rows.flags.writeable else rows.copy())
        if tuple(rows.shape) != (uniq_np.shape[0], self.dim):
            raise ValueError(
                f"rows have shape {tuple(rows.shape)}, expected ({uniq_np.shape[0]}, {self.dim})"
            )
        leaf = rows.detach().to(self.dtype).requires_grad_(True)
        self._keys, self._rows = uniq_np, leaf
        return F.embedding(inverse.reshape(keys.shape), leaf)

    def sparse_grads(self) -> tuple[np.ndarray, np.ndarray]:
        """``(unique keys int64 [u], their gradients float32 [u, dim])`` of the last forward."""
        if self._rows is None or self._keys is None:
            raise RuntimeError("sparse_grads() called before any forward()")
        grad = self._rows.grad
        if grad is None:
            raise RuntimeError(
                "no gradient for the embedding rows: call backward() on a loss that uses them"
            )
        return self._keys, grad.detach().to(torch.float32).numpy()

    def extra_repr(self) -> str:
        return f"dim={self.dim}, dtype={self.dtype}, store={type(self.store).__name__}"


TableArrays = dict[str, np.ndarray]


def features_in_order(
    outputs: Sequence[torch.Tensor], columns: Sequence[Sequence[int]], num_features: int
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Per-table outputs ``[B, F_t, d_t]`` (table t's column j is the data's feature
    ``columns[t][j]``) -> the features in the data's order: ``[B, F, d]`` when every table has
    the width d, else a tuple of ``F`` tensors ``[B, d_f]`` (a model that accepts mixed widths
    projects them, :class:`cpu_dist.models.dlrm.DLRM`).  One table holding every feature in
    order is returned as it is (the default job: no copy, today's bits)."""
    if len(outputs) == 1 and list(columns[0]) == list(range(num_features)):
        return outputs[0]
    where: list[tuple[int, int]] = [(-1, -1)] * num_features
    for t, cols in enumerate(columns):
        for j, f in enumerate(cols):
            where[f] = (t, j)
    if len({int(o.shape[-1]) for o in outputs}) == 1:
        flat = torch.cat(list(outputs), dim=1)  # [B, sum F_t, d] in table order
        start = np.cumsum([0] + [len(c) for c in columns])[:-1]
        order = torch.tensor([int(start[t]) + j for t, j in where], dtype=torch.int64)
        return flat.index_select(1, order)
    return tuple(outputs[t][:, j] for t, j in where)


class TableEmbedding(nn.Module):
    """The embedding of a job's tables: per-table keys ``{name: [B, F_t]}`` and per-table rows
    of their unique keys -> the features' vectors in the data's feature order
    (:func:`features_in_order`), so that a model is the same whether its features share one
    fused table or have a table each.

    ``tables``: ``(name, dim, columns)`` per table in the job's table order (``columns``: the
    data's feature index of each of the table's features).  Each table is a
    :class:`ShardedEmbedding` whose rows the caller passes (the step pipelines pull every
    table in one request per shard); ``store``, if given, serves forwards without rows.
    """

    def __init__(
        self,
        tables: Sequence[tuple[str, int, Sequence[int]]],
        num_features: int,
        store: TableStore | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if not tables:
            raise ValueError("need at least one table")
        self.names = tuple(t[0] for t in tables)
        self.dims = {t[0]: int(t[1]) for t in tables}
        self.columns = [list(t[2]) for t in tables]
        self.num_features = int(num_features)
        self._store = store
        self.tables = {
            name: ShardedEmbedding(_OneOf(store, name), dim, dtype) for name, dim, _ in tables
        }
        self.feature_dims = [0] * self.num_features
        for (_, dim, _), cols in zip(tables, self.columns):
            for f in cols:
                self.feature_dims[f] = int(dim)
        self._dtype = dtype

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @dtype.setter
    def dtype(self, dtype: torch.dtype) -> None:  # build_dlrm sets the model's compute dtype
        self._dtype = dtype
        for t in self.tables.values():
            t.dtype = dtype

    @staticmethod
    def plan_keys(keys: Mapping[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """:meth:`ShardedEmbedding.plan_keys` per table (a loader thread's work)."""
        return {name: ShardedEmbedding.plan_keys(k) for name, k in keys.items()}

    def use_plan(
        self,
        keys: Mapping[str, torch.Tensor],
        plan: Mapping[str, tuple[np.ndarray, np.ndarray]],
    ) -> TableArrays:
        """Each table's sorted unique keys, from plans made ahead for these very tensors."""
        return {name: self.tables[name].use_plan(keys[name], plan[name]) for name in self.names}

    def unique_keys(self, keys: Mapping[str, torch.Tensor | np.ndarray]) -> TableArrays:
        return {name: self.tables[name].unique_keys(keys[name]) for name in self.names}

    def forward(
        self,
        keys: Mapping[str, torch.Tensor],
        rows: Mapping[str, torch.Tensor | np.ndarray] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        outs = [
            self.tables[name](keys[name], None if rows is None else rows[name])
            for name in self.names
        ]
        return features_in_order(outs, self.columns, self.num_features)

    def sparse_grads(self) -> tuple[TableArrays, TableArrays]:
        """``({table: unique keys}, {table: float32 grads [u, dim]})`` of the last forward."""
        keys: TableArrays = {}
        grads: TableArrays = {}
        for name in self.names:
            keys[name], grads[name] = self.tables[name].sparse_grads()
        return keys, grads

    def extra_repr(self) -> str:
        return ", ".join(f"{n}: dim={self.dims[n]}" for n in self.names)


class TableStore(Protocol):
    """Rows of several tables' keys: ``cpu_dist.sparse.Client.pull_tables`` or a test's."""

    def pull_tables(self, parts: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]: ...


class _OneOf:
    """One table of a :class:`TableStore`, as a :class:`RowStore`."""

    def __init__(self, store: TableStore | None, name: str) -> None:
        self.store, self.name = store, name

    def pull(self, keys: np.ndarray) -> np.ndarray:
        if self.store is None:
            raise RuntimeError(f"table {self.name!r}: no store to pull from; pass the rows")
        return np.asarray(self.store.pull_tables({self.name: keys})[self.name])
