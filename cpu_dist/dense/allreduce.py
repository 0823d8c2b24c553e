"""Dense gradients: fused into flat buckets, all-reduced in place with mpi4py, averaged.

Each bucket is one contiguous tensor per dtype and ``param.grad`` are views into it, so
autograd accumulates straight into the buffer that MPI reduces: no copy in, no copy out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from mpi4py import MPI

DEFAULT_BUCKET_BYTES = 16 << 20


class GradientBuckets:
    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        comm: MPI.Intracomm,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ) -> None:
        self.comm = comm
        self.world = comm.Get_size()
        self.buckets: list[torch.Tensor] = []
        self.bytes_reduced = 0
        group: list[torch.nn.Parameter] = []
        for p in [p for p in params if p.requires_grad]:
            if group and (
                p.dtype != group[0].dtype
                or sum(q.numel() for q in group) * p.element_size() >= bucket_bytes
            ):
                self._make_bucket(group)
                group = []
            group.append(p)
        if group:
            self._make_bucket(group)

    def _make_bucket(self, params: list[torch.nn.Parameter]) -> None:
        flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p)
            offset += n
        self.buckets.append(flat)

    def zero(self) -> None:
        for b in self.buckets:
            b.zero_()

    def allreduce_mean(self) -> None:
        for b in self.buckets:
            buf = b.numpy()
            self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            if self.world > 1:
                b.div_(self.world)
            self.bytes_reduced += buf.nbytes


def broadcast_parameters(module: torch.nn.Module, comm: MPI.Intracomm, root: int = 0) -> None:
    """Every worker starts from the root's parameters (and buffers)."""
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            buf = t.detach().contiguous()
            comm.Bcast(buf.numpy(), root=root)
            if buf.data_ptr() != t.data_ptr():
                t.copy_(buf)


# --dense-optimizer -> torch's class (cpu_dist.common.dense_optimizer decides the arguments)
TORCH_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "adagrad": torch.optim.Adagrad,
}


def make_dense_optimizer(
    name: str,
    params: Iterable[torch.nn.Parameter],
    lr: float,
    args: Sequence[tuple[str, object]] = (),
) -> torch.optim.Optimizer:
    """torch's optimizer ``name`` at rate ``lr`` with the job's resolved keyword arguments
    (``TrainConfig.dense_optimizer_args``; empty: torch's defaults): the workers' two dense
    paths and the reference build it here, so they step alike."""
    if name not in TORCH_OPTIMIZERS:
        raise ValueError(
            f"--dense-optimizer {name!r}: expected one of {', '.join(TORCH_OPTIMIZERS)}"
        )
    return TORCH_OPTIMIZERS[name](params, lr=lr, **dict(args))  # type: ignore[call-arg, arg-type]


def set_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """This step's learning rate (a schedule's, ``cpu_dist.common.schedule``) on every
    parameter group: the job's workers and the reference set it the same way."""
    for group in optimizer.param_groups:
        group["lr"] = lr
