"""The ``--dump-state`` file: the whole trained model as one ``.npz``.

``dense/<name>`` for every dense parameter, ``sparse_keys`` (int64, sorted) and
``sparse_values`` (float32 rows, same order) for every row the PS holds.  The distributed loop
and the single-process reference both produce it through :func:`model_arrays`, so their dumps
compare key for key.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from cpu_dist.common.files import atomic_write
from cpu_dist.models.dlrm import DLRM


def model_arrays(model: DLRM, keys: np.ndarray, values: np.ndarray) -> dict[str, np.ndarray]:
    out = {f"dense/{name}": p.detach().numpy().copy() for name, p in model.dense_named_parameters()}
    out["sparse_keys"] = np.asarray(keys, dtype=np.int64)
    out["sparse_values"] = np.asarray(values, dtype=np.float32)
    return out


def write_dump(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Atomically: a reader sees the old file or the whole new one (``--dump-state`` was
    checked before training: a missing file, or an earlier dump)."""
    out = Path(os.path.abspath(path))
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda f: np.savez(f, **arrays))  # type: ignore[arg-type]
