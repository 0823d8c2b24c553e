"""DLRM structure, interaction, init determinism and the MLP flag parser."""

import pytest
import torch
from torch import nn

from cpu_dist.common.contracts import row_init
from cpu_dist.models import DLRM, ShardedEmbedding, build_dlrm

pytestmark = pytest.mark.timeout(30)

DIM, ND, NS = 4, 3, 5


class InitStore:
    def pull(self, keys):
        return row_init(1, keys, DIM, 0.5)


def _inputs(b: int = 6):
    g = torch.Generator().manual_seed(0)
    return torch.rand(b, ND, generator=g), torch.randint(0, 50, (b, NS), generator=g)


def _model(seed: int = 0, dtype=torch.float32) -> DLRM:
    return build_dlrm(
        ShardedEmbedding(InitStore(), DIM),
        num_dense=ND,
        num_sparse=NS,
        dim=DIM,
        bot_mlp=[8, DIM],
        top_mlp=[6, 1],
        seed=seed,
        dtype=dtype,
    )


def test_structure_names_and_logit_shape():
    m = _model()
    names = [n for n, _ in m.dense_named_parameters()]
    assert names == [
        "bot.0.weight",
        "bot.0.bias",
        "bot.2.weight",
        "bot.2.bias",
        "top.0.weight",
        "top.0.bias",
        "top.2.weight",
        "top.2.bias",
    ]
    assert isinstance(m.bot[-1], nn.ReLU) and isinstance(m.top[-1], nn.Linear)
    n = NS + 1
    assert m.top[0].in_features == DIM + n * (n - 1) // 2
    dense, keys = _inputs()
    out = m(dense, keys)
    assert out.shape == (6,) and out.dtype == torch.float32


def test_interaction_is_bottom_then_upper_triangle_dots():
    m = _model()
    g = torch.Generator().manual_seed(1)
    bottom, emb = torch.randn(2, DIM, generator=g), torch.randn(2, NS, DIM, generator=g)
    got = m.interact(bottom, emb)
    vecs = [bottom] + [emb[:, f] for f in range(NS)]
    want = [bottom] + [
        (vecs[i] * vecs[j]).sum(1, keepdim=True)
        for i in range(NS + 1)
        for j in range(i + 1, NS + 1)
    ]
    torch.testing.assert_close(got, torch.cat(want, dim=1))


def test_init_depends_only_on_seed_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a, b, c = _model(seed=5), _model(seed=5), _model(seed=6)
    assert torch.equal(torch.rand(3), before), "build_dlrm must not consume the caller's RNG"
    for (na, pa), (_, pb), (_, pc) in zip(
        a.named_parameters(), b.named_parameters(), c.named_parameters()
    ):
        assert torch.equal(pa, pb), na
        assert not torch.equal(pa, pc), na
    # Same init whatever the embedding module is.
    bag = nn.EmbeddingBag(50, DIM, mode="sum")
    d = build_dlrm(
        bag, num_dense=ND, num_sparse=NS, dim=DIM, bot_mlp=[8, DIM], top_mlp=[6, 1], seed=5
    )
    assert torch.equal(
        dict(d.dense_named_parameters())["top.2.weight"],
        dict(a.dense_named_parameters())["top.2.weight"],
    )
    assert [n for n, _ in d.dense_named_parameters()] == [n for n, _ in a.dense_named_parameters()]


def test_float64_model():
    m32, m64 = _model(dtype=torch.float32), _model(dtype=torch.float64)
    assert m64.embedding.dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in m64.parameters())
    dense, keys = _inputs()
    out64 = m64(dense, keys)
    assert out64.dtype == torch.float64
    torch.testing.assert_close(out64.float(), m32(dense, keys), rtol=1e-5, atol=1e-5)


def test_prepulled_rows_give_the_same_logits():
    m = _model()
    dense, keys = _inputs()
    rows = torch.from_numpy(InitStore().pull(m.embedding.unique_keys(keys)))
    torch.testing.assert_close(m(dense, keys, rows=rows), m(dense, keys))


def test_bad_widths_are_rejected():
    emb = ShardedEmbedding(InitStore(), DIM)
    with pytest.raises(ValueError, match="embedding dim"):
        DLRM(emb, ND, NS, DIM, bot_mlp=[8, DIM + 1], top_mlp=[1])
    with pytest.raises(ValueError, match="must be 1"):
        DLRM(emb, ND, NS, DIM, bot_mlp=[DIM], top_mlp=[8, 2])
    with pytest.raises(ValueError):
        DLRM(emb, ND, NS, DIM, bot_mlp=[DIM], top_mlp=[])


class BagByKey(nn.Module):
    """A user's own embedding module: keys [B, F] -> [B, F, dim], no rows argument."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(50, DIM, mode="sum")

    def forward(self, keys):
        return self.bag(keys.reshape(-1, 1)).reshape(*keys.shape, DIM)


def test_any_embedding_module_works():
    m = build_dlrm(
        BagByKey(), num_dense=ND, num_sparse=NS, dim=DIM, bot_mlp=[DIM], top_mlp=[1], seed=0
    )
    dense, keys = _inputs()
    out = m(dense, keys)
    assert out.shape == (6,)
    out.sum().backward()
    assert m.embedding.bag.weight.grad is not None
    assert "embedding.bag.weight" not in dict(m.dense_named_parameters())
    with pytest.raises(TypeError, match="rows"):
        m(dense, keys, rows=torch.zeros(1, DIM))
