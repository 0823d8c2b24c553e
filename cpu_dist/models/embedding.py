"""An embedding layer whose rows live in an external store (the parameter server).

The rows are not torch parameters: each forward pulls the rows of the batch's unique keys,
wraps them in a leaf tensor that requires grad, and after backward the leaf's gradient is the
per-unique-key gradient the trainer pushes back to the store. Deduplicating before the pull
keeps the traffic at one row per distinct key, and summing the gradients of repeated keys is
exactly what autograd does for the indexing.
"""

from __future__ import annotations

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
