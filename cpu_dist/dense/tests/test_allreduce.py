"""Single-rank checks of the bucket mechanics; tests/mpi covers several ranks."""

import pytest
import torch
from mpi4py import MPI

from cpu_dist.dense.allreduce import GradientBuckets, make_dense_optimizer

pytestmark = pytest.mark.timeout(30)


def test_grads_accumulate_in_bucket_views():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    buckets = GradientBuckets(model.parameters(), MPI.COMM_SELF, bucket_bytes=40)
    assert len(buckets.buckets) > 1  # small buckets: the parameters were split across several
    x = torch.randn(5, 4)
    expected = torch.func.grad(lambda ps: torch.func.functional_call(model, ps, (x,)).sum())(
        dict(model.named_parameters())
    )
    buckets.zero()
    model(x).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name])
    total = sum(b.numel() for b in buckets.buckets)
    assert total == sum(p.numel() for p in model.parameters())
    before = [b.clone() for b in buckets.buckets]
    buckets.allreduce_mean()  # one rank: the mean is the value itself
    for a, b in zip(before, buckets.buckets):
        torch.testing.assert_close(a, b)
    buckets.zero()
    assert all(float(p.grad.abs().sum()) == 0 for p in model.parameters())


def test_float64_parameters_get_their_own_bucket():
    a = torch.nn.Linear(2, 2)
    b = torch.nn.Linear(2, 2).double()
    buckets = GradientBuckets(list(a.parameters()) + list(b.parameters()), MPI.COMM_SELF)
    assert sorted(str(x.dtype) for x in buckets.buckets) == ["torch.float32", "torch.float64"]


def test_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match="--dense-optimizer 'lamb': expected one of sgd, adam"):
        make_dense_optimizer("lamb", torch.nn.Linear(1, 1).parameters(), 0.1)


def test_the_jobs_settings_reach_torchs_optimizer():
    args = (("betas", (0.8, 0.99)), ("eps", 1e-6), ("weight_decay", 0.05))
    opt = make_dense_optimizer("adam", torch.nn.Linear(2, 1).parameters(), 0.1, args)
    assert isinstance(opt, torch.optim.Adam)
    group = opt.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (
        0.1,
        (0.8, 0.99),
        1e-6,
        0.05,
    )
