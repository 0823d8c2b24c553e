"""Where an embedding bag collection's rows come from: the :class:`RowSource` seam.

Outside a job a collection owns a :class:`LocalRows`: every table is a lazy store whose rows
are created at first touch from ``contracts.row_init`` (only touched rows exist, so a raw-id
table or a 40M-row one costs what a run touches) and updated by
``contracts.sparse_update``, the parameter server's optimizers in numpy.  That makes a user's
model, as written, its own single-process reference.  Inside a job the framework gives the
collection a source that hands it the rows the step pipeline pulled for this batch and
collects their gradients (issue 25's next step); the collection does not change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from cpu_dist.common.contracts import row_init, sparse_update, state_floats

__all__ = ["LazyTable", "LocalRows", "RowSource", "TableSpec"]


class TableSpec(Protocol):
    """What a row source reads of a table (an :class:`EmbeddingBagConfig`)."""

    @property
    def name(self) -> str: ...
    @property
    def embedding_dim(self) -> int: ...
    @property
    def init_scale(self) -> float: ...
    @property
    def optimizer(self) -> str: ...
    @property
    def lr(self) -> float: ...
    @property
    def eps(self) -> float: ...
    @property
    def admit_after(self) -> int: ...
    @property
    def expire_after(self) -> int: ...


@runtime_checkable
class RowSource(Protocol):
    """Rows for a table's ids: ``lookup(table, ids)`` with ``ids`` int64 ``[u]``, sorted and
    unique, returns ``[u, dim]`` rows, a tensor that requires grad while autograd records, so
    that the source can collect the rows' gradients after backward."""

    def lookup(self, table: str, ids: np.ndarray) -> torch.Tensor: ...


class LazyTable:
    """One table's touched rows, grown at first touch: float32 rows and optimizer state
    (``[.., dim]`` or ``[..]``, ``contracts.state_floats``) in touch order, in arrays whose
    capacity doubles, and a sorted index (ids, slots) to find them.  A new id moves only the
    index's int64 entries, never the rows, so a step that touches new ids costs
    ``O(index + new rows)``, not a copy of the table."""

    def __init__(self, spec: TableSpec, seed: int) -> None:
        self.name, self.dim = spec.name, int(spec.embedding_dim)
        self.scale, self.seed = float(spec.init_scale), int(seed)
        self.optimizer, self.eps = spec.optimizer, float(spec.eps)
        width = state_floats(self.optimizer, self.dim)
        self._state_shape: tuple[int, ...] = (self.dim,) if width > 1 else ()
        self._set(
            np.zeros(0, dtype=np.int64),
            np.zeros((0, self.dim), dtype=np.float32),
            np.zeros((0, *self._state_shape), dtype=np.float32),
        )

    def _set(self, ids: np.ndarray, rows: np.ndarray, state: np.ndarray) -> None:
        """Hold exactly these (sorted ids, their rows and state)."""
        self._ids = ids
        self._slots = np.arange(len(ids), dtype=np.int64)
        self._rows, self._state, self._n = rows, state, len(ids)

    def __len__(self) -> int:
        return self._n

    @property
    def ids(self) -> np.ndarray:
        """The held ids, sorted (a view: do not modify)."""
        return self._ids

    @property
    def rows(self) -> np.ndarray:
        """The held rows in id order (a copy)."""
        return self._rows[self._slots]

    @property
    def state(self) -> np.ndarray:
        """The held optimizer state in id order (a copy)."""
        return self._state[self._slots]

    def _where(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.searchsorted(self._ids, ids)
        found = np.zeros(len(ids), dtype=bool)
        inside = pos < len(self._ids)
        found[inside] = self._ids[pos[inside]] == ids[inside]
        return pos, found

    def _grow(self, extra: int) -> None:
        need = self._n + extra
        if need <= len(self._rows):
            return
        cap = max(need, 2 * len(self._rows), 16)
        rows = np.empty((cap, self.dim), dtype=np.float32)
        rows[: self._n] = self._rows[: self._n]
        state = np.zeros((cap, *self._state_shape), dtype=np.float32)
        state[: self._n] = self._state[: self._n]
        self._rows, self._state = rows, state

    def get(self, ids: np.ndarray, create: bool) -> np.ndarray:
        """Rows of sorted unique ``ids`` (a copy); unseen ones are their first-touch rows,
        kept in the table when ``create``."""
        pos, found = self._where(ids)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        out[found] = self._rows[self._slots[pos[found]]]
        missing = ~found
        if missing.any():
            new = row_init(self.seed, ids[missing], self.dim, self.scale, self.name)
            out[missing] = new
            if create:
                m = len(new)
                self._grow(m)
                slots = np.arange(self._n, self._n + m, dtype=np.int64)
                self._rows[slots] = new
                self._state[slots] = 0.0
                at = pos[missing]
                self._ids = np.insert(self._ids, at, ids[missing])
                self._slots = np.insert(self._slots, at, slots)
                self._n += m
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        """The held state as arrays in id order (copies): ``ids``, ``weight``,
        ``optimizer_state``."""
        return {"ids": self._ids.copy(), "weight": self.rows, "optimizer_state": self.state}

    def check(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Refuse :meth:`arrays`' that this table cannot hold: ids not sorted unique int64,
        rows not ``[n, dim]``, a state not of this optimizer's shape."""
        ids = np.asarray(arrays["ids"])
        rows = np.asarray(arrays["weight"])
        state = np.asarray(arrays["optimizer_state"])
        where = f"table {self.name!r}"
        if ids.dtype != np.int64 or ids.ndim != 1 or np.any(np.diff(ids) <= 0):
            raise ValueError(f"{where}: ids must be sorted unique int64 [n]")
        n = len(ids)
        if rows.shape != (n, self.dim):
            raise ValueError(f"{where}: weight {rows.shape}: expected ({n}, {self.dim})")
        if state.shape != (n, *self._state_shape):
            raise ValueError(
                f"{where}: optimizer_state {state.shape}: expected {(n, *self._state_shape)} "
                f"({self.optimizer})"
            )

    def load(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Replace the held state by :meth:`arrays`' (after :meth:`check`)."""
        self.check(arrays)
        self._set(
            np.asarray(arrays["ids"], dtype=np.int64).copy(),
            np.array(arrays["weight"], dtype=np.float32),
            np.array(arrays["optimizer_state"], dtype=np.float32),
        )

    def update(self, ids: np.ndarray, grads: np.ndarray, lr: float) -> None:
        """``contracts.sparse_update`` on the held rows ``ids`` (sorted, unique) with their
        aggregated gradients, the parameter server's arithmetic."""
        pos, found = self._where(ids)
        if not found.all():
            raise KeyError(f"table {self.name!r}: id {int(ids[~found][0])} was never looked up")
        slots = self._slots[pos]
        rows, state = self._rows[slots], self._state[slots]
        extra = {"eps": self.eps} if self.optimizer == "adagrad" else {}
        sparse_update(self.optimizer, rows, state, grads, lr, **extra)
        self._rows[slots], self._state[slots] = rows, state


class LocalRows:
    """The row source of a collection outside a job: one :class:`LazyTable` per table, and
    the rows each forward handed out, until :meth:`sparse_step` applies their gradients."""

    def __init__(self, tables: Sequence[TableSpec], seeds: Mapping[str, int]) -> None:
        self.specs = {t.name: t for t in tables}
        self.tables = {t.name: LazyTable(t, seeds[t.name]) for t in tables}
        self._handed: list[tuple[str, np.ndarray, torch.Tensor]] = []

    def lookup(self, table: str, ids: np.ndarray) -> torch.Tensor:
        recording = torch.is_grad_enabled()
        rows = torch.from_numpy(self.tables[table].get(ids, create=recording))
        if recording:
            rows.requires_grad_(True)
            self._handed.append((table, ids, rows))
        return rows

    def zero_grad(self) -> None:
        """Forget the rows handed out since the last step (their gradients are dropped)."""
        self._handed.clear()

    def sparse_step(self, lr: float | None = None) -> dict[str, int]:
        """Apply each table's optimizer to the rows the forwards since the last step used,
        with the gradients backward left on them (summed per id over forwards), then forget
        them.  ``lr``: every table's rate (default: each table's own).  Returns the rows
        updated per table."""
        grads: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        for table, ids, rows in self._handed:
            if rows.grad is not None:
                grads.setdefault(table, []).append((ids, rows.grad.numpy()))
        self._handed.clear()
        updated = dict.fromkeys(self.tables, 0)
        for name, parts in grads.items():
            spec = self.specs[name]
            if spec.admit_after > 1 or spec.expire_after > 0:
                raise ValueError(
                    f"table {name!r}: admit_after / expire_after are the parameter server's "
                    "rules; a local EmbeddingBagCollection does not apply them yet"
                )
            if len(parts) == 1:
                ids, g = parts[0]
                g = np.ascontiguousarray(g, dtype=np.float32)
            else:
                ids, inverse = np.unique(np.concatenate([p[0] for p in parts]), return_inverse=True)
                g = np.zeros((len(ids), spec.embedding_dim), dtype=np.float32)
                np.add.at(g, inverse.reshape(-1), np.concatenate([p[1] for p in parts]))
            self.tables[name].update(ids, g, spec.lr if lr is None else lr)
            updated[name] = len(ids)
        return updated
