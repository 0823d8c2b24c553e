"""The rows a job's step pipeline pulled, handed to the model's collections: TorchRec's
``PipelinedForward`` idea without replacing any forward.

A job gives every :class:`~cpu_dist.embeddings.EmbeddingBagCollection` of the user's model one
shared :class:`StepRows` as its row source (:func:`distribute`).  Per step the loop binds what
the pipeline read (each table's planned unique ids, their inverse and their rows); the
collections' own ``forward`` then asks the source for each table's plan and rows, as it asks
its local rows outside a job, so the model keeps its ``forward(dense, sparse)`` and never sees
the parameter server.  After backward :meth:`StepRows.grads` collects each table's row
gradients for the commit.  The binding replaces the ``forward(rows=)`` side door and the
lookup of planned keys by tensor identity: the plan is checked against the ids the model
actually looked up, so a model that feeds its collection something else than the batch's
features is an error naming the table, not a silent mismatch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import torch
from torch import nn

from cpu_dist.embeddings import collections_of

# Per table: (sorted unique ids, inverse [n]): what the loader plans ahead for a batch.
Plans = dict[str, tuple[np.ndarray, np.ndarray]]


class StepRows:
    """The row source of a model's collections inside a job (a
    :class:`~cpu_dist.embeddings.RowSource` with a plan).

    One binding per forward: :meth:`bind` before it, :meth:`grads` after its backward.  Each
    table is looked up at most once per binding (the pipeline pulled one set of rows per
    table for the step).
    """

    def __init__(self) -> None:
        self._plans: Plans = {}
        self._rows: Mapping[str, torch.Tensor] = {}
        self._leaves: dict[str, torch.Tensor] = {}

    def bind(self, plans: Plans, rows: Mapping[str, torch.Tensor]) -> None:
        """The next forward's plans and their rows (every table of ``plans``)."""
        absent = [t for t in plans if t not in rows]
        if absent:
            raise KeyError(f"table {absent[0]!r}: planned but no rows were read for it")
        self._plans, self._rows, self._leaves = plans, rows, {}

    def plan(self, table: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The bound plan of ``table``, checked to be the plan of ``ids``."""
        if table not in self._plans:
            raise KeyError(
                f"table {table!r}: no rows were read for it this step (the step planned "
                f"{', '.join(self._plans) or 'no table'})"
            )
        unique, inverse = self._plans[table]
        # (np.take: a third faster than unique[inverse] on a step's 200k ids)
        if len(inverse) != len(ids) or not np.array_equal(np.take(unique, inverse), ids):
            raise ValueError(
                f"table {table!r}: the model looked up {len(ids)} ids that are not the "
                f"{len(inverse)} of the batch's features the step planned (a model must pass "
                "the batch's KeyedJaggedTensor, or features taken from it, to its collections)"
            )
        return unique, inverse

    def lookup(self, table: str, ids: np.ndarray) -> torch.Tensor:
        if table in self._leaves:
            raise RuntimeError(
                f"table {table!r} was looked up twice in one step: a job reads one set of rows "
                "per table per step (call each collection once per forward)"
            )
        rows = self._rows[table]
        if len(rows) != len(ids):
            raise ValueError(f"table {table!r}: {len(rows)} rows read for {len(ids)} ids")
        leaf = rows.detach()
        if torch.is_grad_enabled():
            leaf.requires_grad_(True)
        self._leaves[table] = leaf
        return leaf

    def rows(self) -> Mapping[str, torch.Tensor]:
        """The bound rows (for a diagnosis of a non-finite loss)."""
        return self._rows

    def grads(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``({table: unique ids}, {table: float32 gradients [u, dim]})`` of the last forward's
        backward, every planned table."""
        keys: dict[str, np.ndarray] = {}
        grads: dict[str, np.ndarray] = {}
        for table, (unique, _) in self._plans.items():
            leaf = self._leaves.get(table)
            grad = None if leaf is None else leaf.grad
            if grad is None:
                raise RuntimeError(
                    f"table {table!r}: its rows got no gradient: the model did not look it up "
                    "or its loss does not depend on it (call backward() on a loss that uses "
                    "every table)"
                )
            keys[table] = unique
            grads[table] = grad.detach().to(torch.float32).numpy()
        return keys, grads


def distribute(model: nn.Module) -> StepRows:
    """Give every collection of ``model`` one shared :class:`StepRows`: from now on their rows
    are the ones the step pipeline binds.  Returns it."""
    found = collections_of(model)
    if not found:
        raise ValueError(f"{type(model).__name__} owns no EmbeddingBagCollection to distribute")
    rows = StepRows()
    for _, ebc in found:
        ebc.set_row_source(rows)
    return rows


def dense_named_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """The model's dense parameters, by name: every parameter (a collection holds its rows
    outside ``parameters()``), which the workers all-reduce and the checkpoint saves."""
    yield from model.named_parameters()
