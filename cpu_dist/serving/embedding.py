"""Rows of an export bundle as an embedding layer: sorted keys looked up by binary search in
the memory map; a key the table never held gets its first-touch row (the PS's row_init,
numpy twin), as a pull from the training job's shards would."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from cpu_dist.common.contracts import row_init
from cpu_dist.common.sorted_keys import find_sorted


class BundleEmbedding(nn.Module):
    def __init__(self, keys: np.ndarray, rows: np.ndarray, seed: int, init_scale: float) -> None:
        super().__init__()
        self.keys, self.rows = keys, rows
        self.seed, self.init_scale, self.dim = seed, init_scale, rows.shape[1]

    def lookup(self, unique: np.ndarray) -> np.ndarray:
        """float32 rows of sorted unique keys."""
        at, found = find_sorted(self.keys, unique)
        out = row_init(self.seed, unique, self.dim, self.init_scale)
        if found.any():
            out[found] = self.rows[at[found]]
        return out

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        flat = keys.reshape(-1).numpy()
        unique, inverse = np.unique(flat, return_inverse=True)
        rows = torch.from_numpy(self.lookup(unique))
        return rows[torch.from_numpy(inverse.reshape(keys.shape))]
