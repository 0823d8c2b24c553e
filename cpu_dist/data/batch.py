"""One global training batch, and each worker's slice of it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Batch:
    """A batch of Criteo-shaped samples.

    ``keys`` are already fused (see :mod:`cpu_dist.data.keys`), so the model never needs to
    know which feature a key came from.  Column f of ``keys`` is the categorical feature
    ``cat_f`` and column f of ``dense`` the dense feature ``int_f`` (TorchRec's names, the
    names a job file's tables use: ``factory.feature_names``).
    """

    dense: np.ndarray  # float32 [B, num_dense]
    keys: np.ndarray  # int64 [B, num_sparse]
    labels: np.ndarray  # float32 [B]

    def __post_init__(self) -> None:
        b = self.labels.shape[0]
        if self.dense.ndim != 2 or self.keys.ndim != 2 or self.labels.ndim != 1:
            raise ValueError("Batch wants dense [B, Fd], keys [B, Fs], labels [B]")
        if self.dense.shape[0] != b or self.keys.shape[0] != b:
            raise ValueError(
                f"batch sizes differ: dense {self.dense.shape}, keys {self.keys.shape}, "
                f"labels {self.labels.shape}"
            )

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def shard(self, rank: int, world: int) -> Batch:
        """Rows ``[rank*B/W, (rank+1)*B/W)``: worker ``rank``'s part of the global batch.

        Contiguous slices keep the global batch the concatenation of the local ones in rank
        order, which is what lets the distributed run be compared with a single process.
        """
        b = len(self)
        if world <= 0 or not 0 <= rank < world:
            raise ValueError(f"bad rank/world: rank={rank}, world={world}")
        if b % world != 0:
            raise ValueError(f"global batch size {b} is not divisible by world size {world}")
        n = b // world
        s = slice(rank * n, (rank + 1) * n)
        return Batch(dense=self.dense[s], keys=self.keys[s], labels=self.labels[s])
