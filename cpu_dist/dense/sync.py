"""How the workers agree on the dense update (``--dense-sync``): two strategies of one interface.

``allreduce``       gradient buckets are all-reduced in place and averaged; every worker runs
                    the optimizer on every parameter (and holds all of its state).
``reduce_scatter``  ZeRO stage 1: all dense parameters live in one flat buffer and their
                    gradients in another; the gradients are reduce-scattered (worker r gets the
                    averaged r-th slice), each worker runs the optimizer on its slice only (so it
                    holds 1/W of the optimizer state), and the parameters are all-gathered back.

Both apply the same averaged gradient with the same elementwise optimizer; only the order in
which MPI adds the W contributions may differ, so the two agree to rounding.  Checkpoints hold
the optimizer state in one form (torch's state_dict of an optimizer over all dense parameters,
as ``allreduce`` keeps it), so a run may resume with another worker count or dense path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from mpi4py import MPI

from cpu_dist.dense.allreduce import GradientBuckets, make_dense_optimizer, set_rate

OptimizerArgs = Sequence[tuple[str, object]]


class DenseSync(Protocol):
    @property
    def bytes_reduced(self) -> int:
        """Bytes of dense gradients reduced so far (this worker's buffer per step)."""
        ...

    def zero_grad(self) -> None: ...

    def reduce(self) -> None:
        """Average the gradients across workers (each worker keeps what it updates)."""
        ...

    def step(self, lr: float | None = None) -> None:
        """Apply the optimizer (at rate ``lr``: the step's scheduled one; None: as set);
        afterwards every worker holds every updated parameter."""
        ...

    def optimizer_state(self) -> dict[str, Any]:
        """The whole optimizer state, in the checkpoint's form.  Collective."""
        ...

    def load_optimizer_state(self, state: dict[str, Any]) -> None: ...

    def optimizer_state_bytes(self) -> int:
        """Bytes of optimizer state this worker holds."""
        ...


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(
        v.numel() * v.element_size()
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor)
    )


class AllreduceSync:
    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        comm: MPI.Intracomm,
        optimizer: str,
        lr: float,
        args: OptimizerArgs = (),
    ) -> None:
        self.buckets = GradientBuckets(params, comm)
        self.optimizer = make_dense_optimizer(optimizer, params, lr, args)

    @property
    def bytes_reduced(self) -> int:
        return self.buckets.bytes_reduced

    def zero_grad(self) -> None:
        self.buckets.zero()

    def reduce(self) -> None:
        self.buckets.allreduce_mean()

    def step(self, lr: float | None = None) -> None:
        if lr is not None:
            set_rate(self.optimizer, lr)
        self.optimizer.step()

    def optimizer_state(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    def optimizer_state_bytes(self) -> int:
        return _state_bytes(self.optimizer)


class ReduceScatterSync:
    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        comm: MPI.Intracomm,
        optimizer: str,
        lr: float,
        args: OptimizerArgs = (),
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(f"--dense-sync reduce_scatter needs one dense dtype, got {dtypes}")
        self.comm, self.world, rank = comm, comm.Get_size(), comm.Get_rank()
        self.name, self.lr, self.args = optimizer, lr, args
        n = sum(p.numel() for p in self.params)
        self.chunk = -(-n // self.world)  # ceil: the buffers are padded to W equal slices
        dtype = dtypes.pop()
        self.flat_param = torch.zeros(self.chunk * self.world, dtype=dtype)
        self.flat_grad = torch.zeros_like(self.flat_param)
        self.offsets = []
        offset = 0
        with torch.no_grad():
            for p in self.params:  # parameters and gradients become views of the buffers
                k = p.numel()
                self.flat_param[offset : offset + k].copy_(p.detach().reshape(-1))
                p.data = self.flat_param[offset : offset + k].view_as(p)
                p.grad = self.flat_grad[offset : offset + k].view_as(p)
                self.offsets.append((offset, k))
                offset += k
        mine = slice(rank * self.chunk, (rank + 1) * self.chunk)
        self.shard = torch.nn.Parameter(self.flat_param[mine])  # shares the buffer's memory
        self.shard.grad = torch.zeros(self.chunk, dtype=dtype)
        self.optimizer = make_dense_optimizer(optimizer, [self.shard], lr, args)
        self.bytes_reduced = 0

    def zero_grad(self) -> None:
        self.flat_grad.zero_()

    def reduce(self) -> None:
        assert self.shard.grad is not None
        self.comm.Reduce_scatter_block(self.flat_grad.numpy(), self.shard.grad.numpy(), op=MPI.SUM)
        if self.world > 1:
            self.shard.grad.div_(self.world)
        self.bytes_reduced += self.flat_grad.numel() * self.flat_grad.element_size()

    def step(self, lr: float | None = None) -> None:
        if lr is not None:
            set_rate(self.optimizer, lr)
        self.optimizer.step()
        self.comm.Allgather(MPI.IN_PLACE, self.flat_param.numpy())

    def optimizer_state_bytes(self) -> int:
        return _state_bytes(self.optimizer)

    # -- the checkpoint's form: an optimizer over every dense parameter -------------------
    def _template(self) -> torch.optim.Optimizer:
        return make_dense_optimizer(self.name, self.params, self.lr, self.args)

    def optimizer_state(self) -> dict[str, Any]:
        full = self._template()
        local = self.optimizer.state.get(self.shard, {})
        for key in sorted(local):
            value = local[key]
            if not (isinstance(value, torch.Tensor) and value.shape == self.shard.shape):
                for p in self.params:  # a scalar (e.g. AdamW's step): the same for every slice
                    full.state[p][key] = value.clone() if isinstance(value, torch.Tensor) else value
                continue
            whole = torch.empty_like(self.flat_param)
            self.comm.Allgather(value.contiguous().numpy(), whole.numpy())
            for p, (offset, k) in zip(self.params, self.offsets):
                full.state[p][key] = whole[offset : offset + k].view_as(p).clone()
        full.param_groups[0].update(
            {k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"}
        )
        return full.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        full = self._template()
        full.load_state_dict(state)
        rank = self.comm.Get_rank()
        mine = slice(rank * self.chunk, (rank + 1) * self.chunk)
        keys = sorted({k for p in self.params for k in full.state.get(p, {})})
        restored: dict[str, Any] = {}
        for key in keys:
            first = full.state[self.params[0]][key]
            if not (isinstance(first, torch.Tensor) and first.shape == self.params[0].shape):
                restored[key] = first.clone() if isinstance(first, torch.Tensor) else first
                continue
            whole = torch.zeros_like(self.flat_param)
            for p, (offset, k) in zip(self.params, self.offsets):
                whole[offset : offset + k] = full.state[p][key].reshape(-1)
            restored[key] = whole[mine].clone()
        self.optimizer.state[self.shard] = restored
        group = full.param_groups[0]
        self.optimizer.param_groups[0].update({k: v for k, v in group.items() if k != "params"})


def make_dense_sync(
    kind: str,
    params: Sequence[torch.nn.Parameter],
    comm: MPI.Intracomm,
    optimizer: str,
    lr: float,
    args: OptimizerArgs = (),
) -> DenseSync:
    """``args``: the optimizer's torch keyword arguments (``TrainConfig.dense_optimizer_args``)."""
    if kind == "allreduce":
        return AllreduceSync(params, comm, optimizer, lr, args)
    if kind == "reduce_scatter":
        return ReduceScatterSync(params, comm, optimizer, lr, args)
    raise ValueError(f"--dense-sync {kind!r}: expected allreduce or reduce_scatter")
