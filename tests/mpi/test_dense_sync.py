"""The two dense paths across real ranks: reduce_scatter (ZeRO-1) updates the parameters as
allreduce does, holds 1/W of the optimizer state, and converts its state to and from the
checkpoint's form (so a run can move between the paths and worker counts)."""

import numpy as np
import pytest
import torch
from mpi4py import MPI

from cpu_dist.dense.sync import AllreduceSync, ReduceScatterSync

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(60)]


def model() -> torch.nn.Module:
    torch.manual_seed(0)  # every rank starts from the same parameters
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def train(sync, net, steps: int, rank: int) -> None:
    gen = torch.Generator().manual_seed(100 + rank)  # every rank's own data
    for _ in range(steps):
        sync.zero_grad()
        net(torch.randn(4, 7, generator=gen)).square().sum().backward()
        sync.reduce()
        sync.step()


def params(net) -> list[np.ndarray]:
    return [p.detach().numpy().copy() for p in net.parameters()]


@pytest.mark.parametrize(
    "optimizer,args,rtol",
    [
        ("sgd", (), 1e-5),
        ("sgd", (("momentum", 0.9), ("weight_decay", 0.01)), 1e-5),
        ("adam", (("betas", (0.8, 0.99)), ("eps", 1e-8), ("weight_decay", 0.01)), 1e-4),
        ("adamw", (), 1e-4),
        ("adagrad", (("eps", 1e-10), ("weight_decay", 0.01)), 1e-5),
    ],
)
def test_reduce_scatter_updates_as_allreduce_does(optimizer, args, rtol):
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    a, b = model(), model()
    ar = AllreduceSync(list(a.parameters()), comm, optimizer, 0.05, args)
    rs = ReduceScatterSync(list(b.parameters()), comm, optimizer, 0.05, args)
    train(ar, a, 4, rank)
    train(rs, b, 4, rank)
    for x, y in zip(params(a), params(b)):
        np.testing.assert_allclose(y, x, rtol=rtol, atol=1e-6)
    # the whole state, gathered from the slices, is allreduce's (a checkpoint's form)
    state, want = rs.optimizer_state(), ar.optimizer_state()
    assert state["param_groups"][0] == want["param_groups"][0]
    for i, s in want["state"].items():
        assert set(state["state"][i]) == set(s)
        for key, value in s.items():
            if isinstance(value, torch.Tensor):
                np.testing.assert_allclose(
                    state["state"][i][key].numpy(), value.numpy(), rtol=rtol, atol=1e-7
                )
    if optimizer == "adamw":  # two float32 moments per element and a step per tensor
        n, tensors = sum(p.numel() for p in a.parameters()), len(list(a.parameters()))
        assert ar.optimizer_state_bytes() == 2 * 4 * n + 4 * tensors
        assert rs.optimizer_state_bytes() == 2 * 4 * -(-n // world) + 4  # its slice only


def test_a_checkpoint_moves_between_the_two_paths():
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    a, b = model(), model()
    ar = AllreduceSync(list(a.parameters()), comm, "adamw", 0.05)
    train(ar, a, 3, rank)
    saved, weights = ar.optimizer_state(), a.state_dict()
    # allreduce -> reduce_scatter, and on: the same as staying on allreduce
    b.load_state_dict(weights)
    rs = ReduceScatterSync(list(b.parameters()), comm, "adamw", 0.05)
    rs.load_optimizer_state(saved)
    train(ar, a, 3, rank + 10)
    train(rs, b, 3, rank + 10)
    for x, y in zip(params(a), params(b)):
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-6)
    # reduce_scatter -> allreduce: the gathered state loads into a plain optimizer
    c = model()
    c.load_state_dict(b.state_dict())
    back = AllreduceSync(list(c.parameters()), comm, "adamw", 0.05)
    back.load_optimizer_state(rs.optimizer_state())
    train(back, c, 2, rank + 20)
    train(rs, b, 2, rank + 20)
    for x, y in zip(params(b), params(c)):
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-6)
