"""The single-process PyTorch reference: the yardstick of the equivalence tests.

The synchronous contract (docs/DESIGN.md) says a synchronous distributed run equals one process
training on the global batches. This module is that one process, written with nothing but
plain PyTorch so that it is easy to trust:

- embeddings: one ``nn.EmbeddingBag(mode="sum")`` with one id per bag over every key that
  appears in the training batches, rows initialised with ``contracts.row_init`` exactly as
  the parameter server initialises a row on first touch;
- dense part: :func:`build_dlrm`, the same function the distributed trainer uses, so the
  dense initial weights are equal;
- loss: ``BCEWithLogitsLoss`` averaged over the global batch;
- dense update: ``torch.optim.SGD`` or ``AdamW`` (defaults except lr);
- sparse update: by hand, on the rows the step touched, in float32 and in the operation order
  of the PS (``csrc/optimizer.h``), so the two can agree to the last bit where the gradients
  do:  SGD ``w -= lr * g``; row-wise Adagrad ``s += (sum_c g_c^2) / dim``,
  ``w -= (lr / (sqrt(s) + 1e-8)) * g``, accumulator starting at 0.

With ``dtype=torch.float64`` the dense part and the embedding compute run in float64 while
the rows stay float32-valued (the PS stores float32): gradients are cast to float32 before
the update and the updated rows are stored back exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import torch
from torch import nn

from cpu_dist.common.contracts import row_init, sparse_update
from cpu_dist.data import Batch, Dataset, train_batches
from cpu_dist.dense.allreduce import make_dense_optimizer
from cpu_dist.models.dlrm import build_dlrm
from cpu_dist.train.dump import model_arrays

if TYPE_CHECKING:  # Python 3.11's; the annotations are never evaluated at run time
    from typing import Unpack

__all__ = ["LocalEmbedding", "ReferenceSettings", "ReferenceTrainer", "train_reference"]


class LocalEmbedding(nn.Module):
    """Fused keys ``[B, F]`` -> rows ``[B, F, dim]`` through a plain ``nn.EmbeddingBag``.

    ``keys`` (sorted, unique) are the bag's index space: key ``keys[i]`` is row ``i``. Keys
    outside that set are an error while autograd records (training), and read as their
    first-touch rows ``row_init(init_seed, key)`` under ``torch.no_grad()`` (evaluation), as
    a PS pull of a never-trained key would.
    """

    def __init__(
        self, keys: np.ndarray, rows: np.ndarray, init_seed: int = 0, init_scale: float = 0.0
    ) -> None:
        super().__init__()
        keys = np.asarray(keys, dtype=np.int64)
        if keys.ndim != 1 or np.any(np.diff(keys) <= 0):
            raise ValueError("keys must be sorted and unique")
        self.keys: torch.Tensor
        self.register_buffer("keys", torch.from_numpy(keys.copy()), persistent=False)
        weight = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32).copy())
        self.bag = nn.EmbeddingBag(
            len(keys), weight.shape[1], mode="sum", sparse=True, _weight=weight
        )
        self.init_seed, self.init_scale = init_seed, init_scale

    def _lookup(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(index of each key, clamped into range; mask of keys that are in the set)."""
        n = len(self.keys)
        if n == 0:
            return torch.zeros_like(flat), torch.zeros(flat.shape, dtype=torch.bool)
        idx = torch.searchsorted(self.keys, flat).clamp(max=n - 1)
        return idx, self.keys[idx] == flat

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        keys = torch.as_tensor(keys)
        flat = keys.reshape(-1)
        idx, found = self._lookup(flat)
        if bool(found.all()):
            out = self.bag(idx.reshape(-1, 1))
        elif torch.is_grad_enabled():
            raise KeyError("a training key is not in the reference embedding's key set")
        else:
            out = self.bag.weight[idx].clone()
            missing = ~found
            init = row_init(
                self.init_seed, flat[missing].numpy(), self.bag.weight.shape[1], self.init_scale
            )
            out[missing] = torch.from_numpy(init).to(out.dtype)
        return out.reshape(*keys.shape, out.shape[-1])


def _training_keys(dataset: Dataset, batch_size: int, start_step: int, steps: int) -> np.ndarray:
    """Sorted unique keys of the training batches the run will see (first pass)."""
    parts = [np.zeros(0, dtype=np.int64)]
    for step, batch in train_batches(dataset, batch_size, start_step):
        if step >= start_step + steps:
            break
        parts.append(np.unique(batch.keys))
    return np.unique(np.concatenate(parts))


class TableRules:
    """The PS's admission and expiry rules on steps (``--ps-admit-after N``,
    ``--ps-expire-after S``; docs/DESIGN.md), per key index of the reference's table.

    At step t (its union of keys, ``idx``): every key's count grows by one; a key's gradient is
    applied once its count reaches N (until then it reads its first-touch row and holds no
    row); then every row last updated at t-S or earlier is dropped (first-touch value, state
    0, count 0), and so is the count of a key never admitted and last seen at t-S or earlier."""

    def __init__(self, size: int, admit_after: int = 0, expire_after: int = 0) -> None:
        self.admit_after, self.expire_after = admit_after, expire_after
        self.count = np.zeros(size, dtype=np.int64)
        self.last_update = np.full(size, -1, dtype=np.int64)  # -1: no row held
        self.last_seen = np.full(size, -1, dtype=np.int64)

    def admitted(self, step: int, idx: np.ndarray) -> np.ndarray:
        """Bool per key of ``idx`` (the step's union): its gradient is applied."""
        self.count[idx] += 1
        self.last_seen[idx] = step
        ok = self.count[idx] >= max(self.admit_after, 1)
        self.last_update[idx[ok]] = step
        return ok

    def expired(self, step: int) -> np.ndarray:
        """Indices of the rows dropped when ``step`` commits (their counts are reset)."""
        if self.expire_after <= 0:
            return np.zeros(0, dtype=np.int64)
        horizon = step - self.expire_after
        held = self.last_update >= 0
        drop = np.flatnonzero(held & (self.last_update <= horizon))
        waiting = np.flatnonzero(~held & (self.count > 0) & (self.last_seen <= horizon))
        self.count[drop] = 0
        self.count[waiting] = 0
        self.last_update[drop] = -1
        return drop

    @property
    def held(self) -> np.ndarray:
        """Bool per key: the PS holds a row for it (admitted, not expired)."""
        return self.last_update >= 0


class _RequiredSettings(TypedDict):
    dim: int
    bot_mlp: Sequence[int]
    top_mlp: Sequence[int]
    seed: int  # the dense weights' (build_dlrm)
    lr: float
    sparse_lr: float | None  # None: lr
    dense_optimizer: str
    sparse_optimizer: str  # "sgd" or "rowwise_adagrad"
    init_scale: float
    init_seed: int  # row_init's


class ReferenceSettings(_RequiredSettings, total=False):
    """What the reference trains with besides its data: the one list of the keywords of
    :class:`ReferenceTrainer` and :func:`train_reference` (which hands them on).  Optional:
    ``dtype`` (dense part; default float32) and the table rules ``admit_after`` and
    ``expire_after`` (default 0: off)."""

    dtype: torch.dtype
    admit_after: int
    expire_after: int


def _check_settings(settings: Mapping[str, object]) -> None:
    """What the type checker holds for typed callers, at run time for the others (tests)."""
    given = set(settings)
    if unknown := given - ReferenceSettings.__required_keys__ - ReferenceSettings.__optional_keys__:
        raise TypeError(f"unknown reference settings: {', '.join(sorted(unknown))}")
    if missing := ReferenceSettings.__required_keys__ - given:
        raise TypeError(f"missing reference settings: {', '.join(sorted(missing))}")


class ReferenceTrainer:
    """The reference's state and one training step; :func:`train_reference` drives it.

    Separate from the driver so tests and tools can evaluate the model between steps.
    """

    def __init__(
        self,
        *,
        keys: np.ndarray,
        num_dense: int,
        num_sparse: int,
        start_step: int = 0,
        **settings: Unpack[ReferenceSettings],
    ) -> None:
        _check_settings(settings)
        dim, init_seed, init_scale = settings["dim"], settings["init_seed"], settings["init_scale"]
        lr, sparse_lr = settings["lr"], settings["sparse_lr"]
        dtype = settings.get("dtype", torch.float32)
        sparse_optimizer = settings["sparse_optimizer"]
        if sparse_optimizer not in ("sgd", "rowwise_adagrad"):
            raise ValueError(f"unknown sparse optimizer {sparse_optimizer!r}")
        self.keys = np.asarray(keys, dtype=np.int64)
        self.embedding = LocalEmbedding(
            self.keys, row_init(init_seed, self.keys, dim, init_scale), init_seed, init_scale
        )
        self.model = build_dlrm(
            self.embedding,
            num_dense=num_dense,
            num_sparse=num_sparse,
            dim=dim,
            bot_mlp=settings["bot_mlp"],
            top_mlp=settings["top_mlp"],
            seed=settings["seed"],
            dtype=dtype,
        )
        self.dtype = dtype
        self.sparse_lr = lr if sparse_lr is None else sparse_lr
        self.sparse_optimizer = sparse_optimizer
        self.optimizer = make_dense_optimizer(
            settings["dense_optimizer"], self.model.dense_parameters(), lr
        )
        self.state = np.zeros(len(self.keys), dtype=np.float32)
        self.rules = TableRules(
            len(self.keys), settings.get("admit_after", 0), settings.get("expire_after", 0)
        )
        self.init_seed, self.init_scale, self.dim = init_seed, init_scale, dim
        self.t = start_step  # the step the next call of step() trains
        self.loss_fn = nn.BCEWithLogitsLoss()

    def step(self, batch: Batch) -> float:
        """One synchronous step on a global batch; returns the loss before the update."""
        weight = self.embedding.bag.weight
        self.optimizer.zero_grad(set_to_none=True)
        weight.grad = None
        logits = self.model(torch.from_numpy(batch.dense), torch.from_numpy(batch.keys))
        loss = self.loss_fn(logits, torch.from_numpy(batch.labels).to(self.dtype))
        loss.backward()

        assert weight.grad is not None
        grad = weight.grad.coalesce()  # sums repeated keys: one gradient per row of the step
        ok = self.rules.admitted(self.t, grad.indices()[0].numpy())
        idx_np = grad.indices()[0].numpy()[ok]
        idx = torch.from_numpy(idx_np)
        rows = weight.data[idx].to(torch.float32).numpy().copy()  # float32-valued in any dtype
        row_state = self.state[idx_np]
        sparse_update(
            self.sparse_optimizer,
            rows,
            row_state,
            grad.values()[torch.from_numpy(ok)].to(torch.float32).numpy(),
            self.sparse_lr,
        )
        self.state[idx_np] = row_state
        weight.data[idx] = torch.from_numpy(rows).to(weight.dtype)
        self._drop(self.rules.expired(self.t))
        self.t += 1
        self.optimizer.step()
        return float(loss.item())

    def _drop(self, idx: np.ndarray) -> None:
        """Rows the PS drops: back to their first-touch values, optimizer state 0."""
        if not len(idx):
            return
        first = row_init(self.init_seed, self.keys[idx], self.dim, self.init_scale)
        weight = self.embedding.bag.weight
        weight.data[torch.from_numpy(idx)] = torch.from_numpy(first).to(weight.dtype)
        self.state[idx] = 0.0

    @torch.no_grad()
    def predict(self, batch: Batch) -> np.ndarray:
        """Logits (float64) of a batch; unseen keys read as their first-touch rows."""
        self.model.eval()
        try:
            logits = self.model(torch.from_numpy(batch.dense), torch.from_numpy(batch.keys))
        finally:
            self.model.train()
        return logits.double().numpy()

    def dump(self) -> dict[str, np.ndarray]:
        """The --dump-state format (:mod:`cpu_dist.train.dump`)."""
        held = self.rules.held
        weight = self.embedding.bag.weight.detach()
        rows = weight[torch.from_numpy(held)].to(torch.float32).numpy()
        return model_arrays(self.model, self.keys[held].copy(), rows.copy())


def train_reference(
    *,
    dataset: Dataset,
    steps: int,
    batch_size: int,
    start_step: int = 0,
    **settings: Unpack[ReferenceSettings],
) -> dict[str, np.ndarray]:
    """Train steps ``[start_step, start_step + steps)`` from fresh weights; the --dump-state dict.

    Returns ``dense/<name>`` (model dtype) for every dense parameter, ``sparse_keys`` (int64,
    sorted: every row the PS would hold) and ``sparse_values`` (float32, same order).
    A Criteo file that ends earlier ends the run earlier, as it does the trainer's.
    """
    trainer = ReferenceTrainer(
        keys=_training_keys(dataset, batch_size, start_step, steps),
        num_dense=dataset.num_dense,
        num_sparse=dataset.num_sparse,
        start_step=start_step,
        **settings,
    )
    for step, batch in train_batches(dataset, batch_size, start_step):
        if step >= start_step + steps:
            break
        trainer.step(batch)
    return trainer.dump()
