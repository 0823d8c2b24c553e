"""A numpy model of the shard's arithmetic (the commit aggregation, and optimizer.h through
the numpy oracle ``cpu_dist.common.contracts.sparse_update``), written independently of the
C++ so that the tests compare two implementations bit for bit."""

from __future__ import annotations

import numpy as np

from cpu_dist.common import contracts

F32 = np.float32


class RefTable:
    def __init__(self, dim: int, seed: int, init_scale: float):
        self.dim, self.seed, self.scale = dim, seed, init_scale
        self.w: dict[int, np.ndarray] = {}
        self.s: dict[int, np.float32] = {}

    def get(self, key: int) -> np.ndarray:
        if key in self.w:
            return self.w[key].copy()
        return contracts.row_init(self.seed, np.array([key]), self.dim, self.scale)[0]

    def _row(self, key: int) -> np.ndarray:
        if key not in self.w:
            self.w[key] = self.get(key)
            self.s[key] = F32(0)
        return self.w[key]

    @staticmethod
    def merge(keys, grads) -> dict[int, np.ndarray]:
        out: dict[int, np.ndarray] = {}
        for k, g in zip(keys.tolist(), grads):
            out[k] = g.astype(F32).copy() if k not in out else (out[k] + g).astype(F32)
        return out

    def apply(self, merged: dict[int, np.ndarray], lr: float, optimizer: str) -> None:
        """Each row through the one numpy optimizer oracle (contracts.sparse_update)."""
        for k, g in merged.items():
            w = self._row(k)[None, :].copy()
            s = np.array([self.s[k]], dtype=F32)
            contracts.sparse_update(optimizer, w, s, g[None, :], lr)
            self.w[k], self.s[k] = w[0], s[0]

    def push(self, keys, grads, lr, optimizer="sgd"):
        self.apply(self.merge(keys, grads), lr, optimizer)

    def commit(self, per_rank: list[tuple[np.ndarray, np.ndarray]], lr, optimizer="sgd"):
        """per_rank[r] = (keys, grads) of rank r; summed in rank order, divided by W."""
        total: dict[int, np.ndarray] = {}
        for keys, grads in per_rank:
            for k, g in zip(keys.tolist(), grads):
                total[k] = g.astype(F32).copy() if k not in total else (total[k] + g).astype(F32)
        w = F32(len(per_rank))
        self.apply({k: (g / w).astype(F32) for k, g in total.items()}, lr, optimizer)

    def dump(self):
        keys = np.array(sorted(self.w), dtype=np.int64)
        vals = np.array([self.w[k] for k in keys.tolist()], dtype=F32).reshape(-1, self.dim)
        st = np.array([self.s[k] for k in keys.tolist()], dtype=F32)
        return keys, vals, st
