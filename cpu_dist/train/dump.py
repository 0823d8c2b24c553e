"""The ``--dump-state`` file: the whole trained model as one ``.npz``.

For every job, the default one included:

- ``dense/<name>``: every dense parameter (the model's dtype);
- ``table/<name>/keys``: int64 [n], sorted ascending, every row the PS holds of table
  ``<name>`` (the default job's one table is ``embedding``, keyed by its fused keys);
- ``table/<name>/values``: float32 [n, dim of that table], row i belongs to keys[i].

The distributed loop and the single-process reference both produce it through
:func:`model_arrays`, so their dumps compare key for key; :func:`table_rows` reads the tables
back out of a dump (tests and tools use it instead of spelling the names).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from cpu_dist.common.files import atomic_write

DENSE_PREFIX = "dense/"
TABLE_PREFIX = "table/"


def table_keys_name(table: str) -> str:
    """The array of table ``table``'s keys in a dump."""
    return f"{TABLE_PREFIX}{table}/keys"


def table_values_name(table: str) -> str:
    """The array of table ``table``'s rows in a dump."""
    return f"{TABLE_PREFIX}{table}/values"


def model_arrays(
    model: torch.nn.Module, tables: Mapping[str, tuple[np.ndarray, np.ndarray]]
) -> dict[str, np.ndarray]:
    """The dump of a model's dense parameters and of every table's rows, ``tables`` mapping
    each table's name to its (keys, values); keys are sorted here (a dump's keys ascend
    whatever order the shards gave them in)."""
    out = {
        f"{DENSE_PREFIX}{name}": p.detach().numpy().copy()
        for name, p in model.named_parameters()  # the dense part: rows are not parameters
    }
    for name, (keys, values) in tables.items():
        keys = np.asarray(keys, dtype=np.int64)
        values = np.asarray(values, dtype=np.float32)
        if values.ndim != 2 or len(values) != len(keys):
            raise ValueError(f"table {name!r}: {len(keys)} keys but values of shape {values.shape}")
        order = np.argsort(keys, kind="stable")
        if not np.all(order == np.arange(len(keys))):
            keys, values = keys[order], values[order]
        out[table_keys_name(name)] = keys
        out[table_values_name(name)] = values
    return out


def table_rows(arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every table of a dump (an ``np.load`` of it, or :func:`model_arrays`' dict): name ->
    (keys, values), in name order."""
    names = sorted(
        k[len(TABLE_PREFIX) : -len("/keys")]
        for k in arrays
        if k.startswith(TABLE_PREFIX) and k.endswith("/keys")
    )
    return {n: (arrays[table_keys_name(n)], arrays[table_values_name(n)]) for n in names}


def write_dump(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Atomically: a reader sees the old file or the whole new one (``--dump-state`` was
    checked before training: a missing file, or an earlier dump)."""
    out = Path(os.path.abspath(path))
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda f: np.savez(f, **arrays))  # type: ignore[arg-type]
