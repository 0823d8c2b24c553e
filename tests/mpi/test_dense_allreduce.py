"""Dense gradients across real worker ranks: mean over ranks, float32 and float64, in place."""

import numpy as np
import pytest
import torch
from mpi4py import MPI

from cpu_dist.dense.allreduce import GradientBuckets, broadcast_parameters

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(60)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_allreduce_mean_and_broadcast(dtype):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    torch.manual_seed(rank)  # every rank starts different...
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 2)).to(dtype)
    broadcast_parameters(model, comm)  # ...and ends with rank 0's parameters
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 2)).to(dtype)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    buckets = GradientBuckets(model.parameters(), comm, bucket_bytes=64)
    buckets.zero()
    x = torch.full((3, 6), float(rank + 1), dtype=dtype)
    model(x).sum().backward()
    buckets.allreduce_mean()
    # Linear => grad is linear in x: the mean over ranks equals the grad at the mean input.
    ref.zero_grad()
    ref(torch.full((3, 6), (size + 1) / 2, dtype=dtype)).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5)
        assert p.grad.dtype == dtype
