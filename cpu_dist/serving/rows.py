"""A bundle's rows as the row source of a model's collections (a
:class:`~cpu_dist.embeddings.RowSource`): read-only, looked up by binary search in each table's
memory-mapped sorted keys; an id the table never held gets its first-touch row
(``contracts.row_init`` of the table's seed, scale and name), as a pull from the training job's
shards would, so a served model scores what the job's evaluation scored."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from cpu_dist.common.contracts import row_init
from cpu_dist.common.sorted_keys import find_sorted

__all__ = ["BundleRows", "TableRows"]


class TableRows:
    """One table's exported rows: ``keys`` int64 ``[n]`` sorted, ``rows`` float32 ``[n, dim]``
    (memory maps, never written), and how a row it lacks is made."""

    def __init__(
        self, name: str, keys: np.ndarray, rows: np.ndarray, seed: int, init_scale: float
    ) -> None:
        if rows.ndim != 2 or keys.shape != (rows.shape[0],):
            raise ValueError(
                f"table {name!r}: keys {keys.shape} and rows {rows.shape} do not pair up"
            )
        self.name, self.keys, self.rows = name, keys, rows
        self.seed, self.init_scale, self.dim = int(seed), float(init_scale), int(rows.shape[1])

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """float32 rows ``[u, dim]`` of sorted unique int64 ``ids`` (a fresh array)."""
        at, found = find_sorted(self.keys, ids)
        out = row_init(self.seed, ids, self.dim, self.init_scale, self.name)
        if found.any():
            out[found] = self.rows[at[found]]
        return out


class BundleRows:
    """The row source every collection of a loaded model reads from: ``lookup(table, ids)``
    returns the rows as a tensor that records no gradient (serving never trains them).

    Args:
        tables: each table's :class:`TableRows`, by name.
    """

    def __init__(self, tables: Mapping[str, TableRows]) -> None:
        self.tables = dict(tables)

    def lookup(self, table: str, ids: np.ndarray) -> torch.Tensor:
        if table not in self.tables:
            raise KeyError(
                f"table {table!r} is not in the bundle (its tables: {', '.join(self.tables)})"
            )
        return torch.from_numpy(self.tables[table].lookup(np.asarray(ids, dtype=np.int64)))
