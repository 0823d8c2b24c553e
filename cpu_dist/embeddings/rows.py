"""Where an embedding bag collection's rows come from: the :class:`RowSource` seam.

Outside a job a collection owns a :class:`LocalRows`: every table is a lazy store whose rows
are created at first touch from ``contracts.row_init`` (only touched rows exist, so a raw-id
table or a 40M-row one costs what a run touches) and updated by
``contracts.sparse_update``, the parameter server's optimizers in numpy, under the parameter
server's admission and expiry rules (``admit_after``, ``expire_after``; the text of
``cpu_dist/sparse/csrc/table_rules.h``).  That makes a user's model, as written, its own
single-process reference.  Inside a job the framework gives the collection a source that
hands it the rows the step pipeline pulled for this batch and collects their gradients; the
collection does not change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from cpu_dist.embeddings.lazy_table import RULE_ARRAYS, LazyTable, TableSpec

__all__ = ["RULE_ARRAYS", "LazyTable", "LocalRows", "RowSource", "TableSpec"]


@runtime_checkable
class RowSource(Protocol):
    """Rows for a table's ids: ``lookup(table, ids)`` with ``ids`` int64 ``[u]``, sorted and
    unique, returns ``[u, dim]`` rows, a tensor that requires grad while autograd records, so
    that the source can collect the rows' gradients after backward."""

    def lookup(self, table: str, ids: np.ndarray) -> torch.Tensor: ...


def _summed(
    parts: Sequence[tuple[np.ndarray, torch.Tensor | None]], dim: int
) -> tuple[np.ndarray, np.ndarray]:
    """One step's union of a table's looked-up ids (sorted, unique) and their gradients
    summed per id over the forwards, in the order they ran; zeros for ids whose rows got no
    gradient (their step still counts them, as a shard counts every id a step pushes)."""
    with_grad = [(ids, g.numpy()) for ids, g in parts if g is not None]
    if len(with_grad) == 1:
        ids, g = with_grad[0]
        g = np.ascontiguousarray(g, dtype=np.float32)
    elif with_grad:
        ids, inverse = np.unique(np.concatenate([p[0] for p in with_grad]), return_inverse=True)
        g = np.zeros((len(ids), dim), dtype=np.float32)
        np.add.at(g, inverse.reshape(-1), np.concatenate([p[1] for p in with_grad]))
    else:
        ids, g = np.zeros(0, dtype=np.int64), np.zeros((0, dim), dtype=np.float32)
    if len(with_grad) == len(parts):
        return ids, g
    union = np.unique(np.concatenate([p[0] for p in parts]))
    out = np.zeros((len(union), dim), dtype=np.float32)
    out[np.searchsorted(union, ids)] = g
    return union, out


class LocalRows:
    """The row source of a collection outside a job: one :class:`LazyTable` per table, and
    the rows each forward handed out, until :meth:`sparse_step` applies their gradients.

    Steps are counted by :meth:`sparse_step` calls, the first being :meth:`start_at`'s step
    (default 0); every table steps at each call, one that no forward used included (its
    expiry runs).  Lookups under ``torch.no_grad()`` never create or count anything.

    Example::

        rows = LocalRows(configs, {c.name: 0 for c in configs})
        rows.start_at(40)            # a reference resumed at step 40 counts from there
    """

    def __init__(self, tables: Sequence[TableSpec], seeds: Mapping[str, int]) -> None:
        self.specs = {t.name: t for t in tables}
        self.tables = {t.name: LazyTable(t, seeds[t.name]) for t in tables}
        self._handed: list[tuple[str, np.ndarray, torch.Tensor]] = []
        self._step = 0

    def start_at(self, step: int) -> None:
        """Number the next :meth:`sparse_step` ``step`` (and the ones after it on), in every
        table: the step a resumed run continues at."""
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
            raise ValueError(f"LocalRows.start_at: step {step!r}: expected an integer >= 0")
        self._step = int(step)
        for table in self.tables.values():
            table.step = int(step)

    @property
    def step(self) -> int:
        """The step the next :meth:`sparse_step` is (the tables with rules carry theirs in
        their arrays, so a table loaded from a saved run continues at its saved step)."""
        ruled = {n: t.step for n, t in self.tables.items() if t.rules}
        if not ruled:
            return self._step
        if len(set(ruled.values())) > 1:
            raise ValueError(
                "LocalRows: the tables with rules are at different steps ("
                + ", ".join(f"{n!r}: {s}" for n, s in ruled.items())
                + "); call start_at(step)"
            )
        return next(iter(ruled.values()))

    def lookup(self, table: str, ids: np.ndarray) -> torch.Tensor:
        recording = torch.is_grad_enabled()
        local = self.tables[table]
        rows = torch.from_numpy(local.get(ids, create=recording and not local.rules))
        if recording:
            rows.requires_grad_(True)
            self._handed.append((table, ids, rows))
        return rows

    def zero_grad(self) -> None:
        """Forget the rows handed out since the last step: their gradients are dropped, their
        ids not counted, and rows created for them not held."""
        self._handed.clear()
        for table in self.tables.values():
            table.discard_fresh()

    def sparse_step(self, lr: float | Mapping[str, float] | None = None) -> dict[str, int]:
        """Apply each table's optimizer, under its rules, to the rows the forwards since the
        last step used, with the gradients backward left on them (summed per id over
        forwards; zeros where none), then forget them.  ``lr``: every table's rate, or a
        rate per table (a schedule's; default: each table's own).  Returns the rows updated
        per table."""
        parts: dict[str, list[tuple[np.ndarray, torch.Tensor | None]]] = {}
        for table, ids, rows in self._handed:
            parts.setdefault(table, []).append((ids, rows.grad))
        self._handed.clear()
        updated: dict[str, int] = {}
        for name, lazy in self.tables.items():
            spec = self.specs[name]
            ids, g = _summed(parts.get(name, []), lazy.dim)
            rate = lr.get(name, spec.lr) if isinstance(lr, Mapping) else lr
            updated[name] = lazy.commit(ids, g, spec.lr if rate is None else rate)
        self._step += 1
        return updated
