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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import torch
from torch import nn

from cpu_dist.common.contracts import TABLE, row_init, sparse_update
from cpu_dist.data import Batch, Dataset, train_batches
from cpu_dist.data.keys import TableKeySplit
from cpu_dist.dense.allreduce import make_dense_optimizer
from cpu_dist.models.dlrm import build_dlrm
from cpu_dist.models.embedding import features_in_order
from cpu_dist.train.dump import model_arrays

if TYPE_CHECKING:  # Python 3.11's; the annotations are never evaluated at run time
    from typing import Unpack

__all__ = [
    "LocalEmbedding",
    "ReferenceSettings",
    "ReferenceTable",
    "ReferenceTrainer",
    "train_reference",
]

SPARSE_OPTIMIZERS = ("sgd", "rowwise_adagrad", "adagrad")


class LocalEmbedding(nn.Module):
    """Fused keys ``[B, F]`` -> rows ``[B, F, dim]`` through a plain ``nn.EmbeddingBag``.

    ``keys`` (sorted, unique) are the bag's index space: key ``keys[i]`` is row ``i``. Keys
    outside that set are an error while autograd records (training), and read as their
    first-touch rows ``row_init(init_seed, key)`` under ``torch.no_grad()`` (evaluation), as
    a PS pull of a never-trained key would.
    """

    def __init__(
        self,
        keys: np.ndarray,
        rows: np.ndarray,
        init_seed: int = 0,
        init_scale: float = 0.0,
        table: str = TABLE,
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
        self.init_seed, self.init_scale, self.table = init_seed, init_scale, table

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
                self.init_seed,
                flat[missing].numpy(),
                self.bag.weight.shape[1],
                self.init_scale,
                self.table,
            )
            out[missing] = torch.from_numpy(init).to(out.dtype)
        return out.reshape(*keys.shape, out.shape[-1])


def _training_keys(
    dataset: Dataset, batch_size: int, start_step: int, steps: int, split: TableKeySplit
) -> dict[str, np.ndarray]:
    """Per table, the sorted unique keys of the training batches the run will see (first
    pass)."""
    parts: dict[str, list[np.ndarray]] = {n: [np.zeros(0, dtype=np.int64)] for n in split.names}
    for step, batch in train_batches(dataset, batch_size, start_step):
        if step >= start_step + steps:
            break
        for name, keys in split(batch.keys).items():
            parts[name].append(np.unique(keys))
    return {name: np.unique(np.concatenate(p)) for name, p in parts.items()}


@dataclass(frozen=True)
class ReferenceTable:
    """One table of the reference: its spec (the dict of ``TableConfig.spec``, INTERFACES:
    name, dim, optimizer, init_scale, seed, num_embeddings, admit_after, expire_after, eps)
    and its learning rate (which travels with each commit, not in the spec)."""

    spec: Mapping[str, Any]
    lr: float

    @property
    def name(self) -> str:
        return str(self.spec["name"])


class _LocalTables(nn.Module):
    """Fused keys ``[B, F]`` -> each table's keys (:class:`TableKeySplit`) -> its
    :class:`LocalEmbedding` -> the features in the data's order (``features_in_order``, the
    same assembly as the distributed ``TableEmbedding``)."""

    def __init__(self, split: TableKeySplit, tables: Mapping[str, LocalEmbedding]) -> None:
        super().__init__()
        self.split = split
        self.tables = nn.ModuleDict(dict(tables))
        self.columns = [split.columns[n].tolist() for n in split.names]

    def forward(self, keys: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        parts = self.split(torch.as_tensor(keys).numpy())
        outs = [self.tables[n](torch.from_numpy(parts[n])) for n in self.split.names]
        return features_in_order(outs, self.columns, self.split.num_features)


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
    # A job's named tables (a job file): each table's spec and lr replace the one table of
    # dim, sparse_optimizer, sparse_lr, init_scale, init_seed and the rules; ``split`` makes
    # each table's keys from the fused keys.  ``dim`` stays the model's interaction width.
    tables: Sequence[ReferenceTable]
    split: TableKeySplit


def _check_settings(settings: Mapping[str, object]) -> None:
    """What the type checker holds for typed callers, at run time for the others (tests)."""
    given = set(settings)
    if unknown := given - ReferenceSettings.__required_keys__ - ReferenceSettings.__optional_keys__:
        raise TypeError(f"unknown reference settings: {', '.join(sorted(unknown))}")
    if missing := ReferenceSettings.__required_keys__ - given:
        raise TypeError(f"missing reference settings: {', '.join(sorted(missing))}")


@dataclass
class _TableState:
    """One table of the reference: its rows (the embedding), optimizer state and rules."""

    name: str
    embedding: LocalEmbedding
    optimizer: str
    lr: float
    eps: float
    state: np.ndarray  # [n] (row-wise Adagrad, SGD) or [n, dim] (Adagrad)
    rules: TableRules
    init_seed: int
    init_scale: float
    dim: int

    @property
    def keys(self) -> np.ndarray:
        return self.embedding.keys.numpy()


def _default_tables(settings: Mapping[str, Any], num_sparse: int) -> list[ReferenceTable]:
    """The one fused table of a job without a job file, from the flags' settings."""
    spec = {
        "name": TABLE,
        "dim": settings["dim"],
        "optimizer": settings["sparse_optimizer"],
        "init_scale": settings["init_scale"],
        "seed": settings["init_seed"],
        "num_embeddings": 0,
        "admit_after": settings.get("admit_after", 0),
        "expire_after": settings.get("expire_after", 0),
        "eps": 0.0,
    }
    sparse_lr = settings["sparse_lr"]
    return [ReferenceTable(spec, settings["lr"] if sparse_lr is None else sparse_lr)]


class ReferenceTrainer:
    """The reference's state and one training step; :func:`train_reference` drives it.

    Separate from the driver so tests and tools can evaluate the model between steps.
    ``keys``: per table, the sorted keys the run trains (an array: the one fused table).
    """

    def __init__(
        self,
        *,
        keys: np.ndarray | Mapping[str, np.ndarray],
        num_dense: int,
        num_sparse: int,
        start_step: int = 0,
        **settings: Unpack[ReferenceSettings],
    ) -> None:
        _check_settings(settings)
        lr = settings["lr"]
        dtype = settings.get("dtype", torch.float32)
        if "tables" in settings:
            tables = list(settings["tables"])
            split = settings["split"]
        else:
            tables = _default_tables(settings, num_sparse)
            split = TableKeySplit({TABLE: range(num_sparse)}, fused=True)
        if not isinstance(keys, Mapping):
            keys = {TABLE: keys}
        self.split = split
        self.tables: list[_TableState] = []
        for t in tables:
            spec = t.spec
            name, dim, kind = t.name, int(spec["dim"]), str(spec["optimizer"])
            if kind not in SPARSE_OPTIMIZERS:
                raise ValueError(f"table {name!r}: unknown sparse optimizer {kind!r}")
            tk = np.asarray(keys[name], dtype=np.int64)
            seed, scale = int(spec["seed"]), float(spec["init_scale"])
            state_shape = (len(tk), dim) if kind == "adagrad" else (len(tk),)
            self.tables.append(
                _TableState(
                    name,
                    LocalEmbedding(tk, row_init(seed, tk, dim, scale, name), seed, scale, name),
                    kind,
                    float(t.lr),
                    float(spec.get("eps", 0.0) or 1e-8) if kind == "adagrad" else 0.0,
                    np.zeros(state_shape, dtype=np.float32),
                    TableRules(
                        len(tk), int(spec.get("admit_after", 0)), int(spec.get("expire_after", 0))
                    ),
                    seed,
                    scale,
                    dim,
                )
            )
        by_name = {t.name: t.embedding for t in self.tables}
        # The default job's one table is the embedding itself (today's module and bits).
        self.embedding: nn.Module = by_name[TABLE] if split.fused else _LocalTables(split, by_name)
        feature_dims = [0] * num_sparse
        for state in self.tables:
            for f in split.columns[state.name].tolist():
                feature_dims[f] = state.dim
        self.model = build_dlrm(
            self.embedding,
            num_dense=num_dense,
            num_sparse=num_sparse,
            dim=settings["dim"],
            bot_mlp=settings["bot_mlp"],
            top_mlp=settings["top_mlp"],
            seed=settings["seed"],
            dtype=dtype,
            feature_dims=feature_dims,
        )
        self.dtype = dtype
        self.optimizer = make_dense_optimizer(
            settings["dense_optimizer"], self.model.dense_parameters(), lr
        )
        self.t = start_step  # the step the next call of step() trains
        self.loss_fn = nn.BCEWithLogitsLoss()

    def step(self, batch: Batch) -> float:
        """One synchronous step on a global batch; returns the loss before the update."""
        self.optimizer.zero_grad(set_to_none=True)
        for state in self.tables:
            state.embedding.bag.weight.grad = None
        logits = self.model(torch.from_numpy(batch.dense), torch.from_numpy(batch.keys))
        loss = self.loss_fn(logits, torch.from_numpy(batch.labels).to(self.dtype))
        loss.backward()
        for state in self.tables:
            self._update(state)
        self.t += 1
        self.optimizer.step()
        return float(loss.item())

    def _update(self, t: _TableState) -> None:
        """Table ``t``'s sparse update of this step, then its expiry (the PS's order)."""
        weight = t.embedding.bag.weight
        if weight.grad is None:  # no feature of this step used the table
            t.rules.admitted(self.t, np.zeros(0, dtype=np.int64))
            self._drop(t, t.rules.expired(self.t))
            return
        grad = weight.grad.coalesce()  # sums repeated keys: one gradient per row of the step
        ok = t.rules.admitted(self.t, grad.indices()[0].numpy())
        idx_np = grad.indices()[0].numpy()[ok]
        idx = torch.from_numpy(idx_np)
        rows = weight.data[idx].to(torch.float32).numpy().copy()  # float32-valued in any dtype
        row_state = t.state[idx_np]
        extra = {"eps": t.eps} if t.optimizer == "adagrad" else {}
        sparse_update(
            t.optimizer,
            rows,
            row_state,
            grad.values()[torch.from_numpy(ok)].to(torch.float32).numpy(),
            t.lr,
            **extra,
        )
        t.state[idx_np] = row_state
        weight.data[idx] = torch.from_numpy(rows).to(weight.dtype)
        self._drop(t, t.rules.expired(self.t))

    @staticmethod
    def _drop(t: _TableState, idx: np.ndarray) -> None:
        """Rows the PS drops: back to their first-touch values, optimizer state 0."""
        if not len(idx):
            return
        first = row_init(t.init_seed, t.keys[idx], t.dim, t.init_scale, t.name)
        weight = t.embedding.bag.weight
        weight.data[torch.from_numpy(idx)] = torch.from_numpy(first).to(weight.dtype)
        t.state[idx] = 0.0

    @torch.no_grad()
    def predict(self, batch: Batch) -> np.ndarray:
        """Logits (float64) of a batch; unseen keys read as their first-touch rows."""
        self.model.eval()
        try:
            logits = self.model(torch.from_numpy(batch.dense), torch.from_numpy(batch.keys))
        finally:
            self.model.train()
        return logits.double().numpy()

    def table_rows(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per table, the rows the PS would hold: (sorted keys, float32 [n, dim])."""
        out = {}
        for t in self.tables:
            held = t.rules.held
            weight = t.embedding.bag.weight.detach()
            rows = weight[torch.from_numpy(held)].to(torch.float32).numpy()
            out[t.name] = (t.keys[held].copy(), rows.copy())
        return out

    def dump(self) -> dict[str, np.ndarray]:
        """The --dump-state format (:mod:`cpu_dist.train.dump`)."""
        return model_arrays(self.model, self.table_rows())


def train_reference(
    *,
    dataset: Dataset,
    steps: int,
    batch_size: int,
    start_step: int = 0,
    **settings: Unpack[ReferenceSettings],
) -> dict[str, np.ndarray]:
    """Train steps ``[start_step, start_step + steps)`` from fresh weights; the --dump-state dict.

    Returns ``dense/<name>`` (model dtype) for every dense parameter and, per table,
    ``table/<name>/keys`` (int64, sorted: every row the PS would hold) and
    ``table/<name>/values`` (float32, same order): :mod:`cpu_dist.train.dump`'s layout.
    A Criteo file that ends earlier ends the run earlier, as it does the trainer's.
    """
    split = settings.get("split") or TableKeySplit({TABLE: range(dataset.num_sparse)}, fused=True)
    trainer = ReferenceTrainer(
        keys=_training_keys(dataset, batch_size, start_step, steps, split),
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
