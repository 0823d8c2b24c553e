"""The built-in DLRM over an EmbeddingBagCollection: its structure and parameter names, the dot
interaction, a forward that is the paper's formula over the collection's rows, a seeded init
that leaves the caller's RNG alone, float64, the width checks and the projections of mixed
table widths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from cpu_dist.common.contracts import default_init_scale, row_init
from cpu_dist.embeddings import EmbeddingBagConfig, KeyedJaggedTensor, sparse_step
from cpu_dist.models import DLRM, ModelError, build_model, dlrm

pytestmark = pytest.mark.timeout(30)

DIM, ND, NS, B = 4, 3, 5, 6
FEATURES = [f"f{i}" for i in range(NS)]
ARGS = {"bot_mlp": [8, DIM], "top_mlp": [6, 1]}


def one_table(dim: int = DIM) -> list[EmbeddingBagConfig]:
    return [EmbeddingBagConfig(0, dim, "t", feature_names=FEATURES)]


def mixed_tables() -> list[EmbeddingBagConfig]:
    """Output order f0, f3 (narrow, 2), f1 (DIM: no projection), f2, f4 (wide, 16)."""
    return [
        EmbeddingBagConfig(0, 2, "narrow", feature_names=["f0", "f3"]),
        EmbeddingBagConfig(0, DIM, "same", feature_names=["f1"]),
        EmbeddingBagConfig(0, 16, "wide", feature_names=["f2", "f4"]),
    ]


def keys() -> np.ndarray:
    """One-hot ids ``[B, NS]``, repeated within and across samples and features."""
    return np.random.default_rng(0).integers(0, 9, (B, NS)).astype(np.int64)


def inputs() -> tuple[torch.Tensor, KeyedJaggedTensor]:
    k = keys()
    dense = torch.from_numpy(np.random.default_rng(1).random((B, ND), dtype=np.float32))
    kjt = KeyedJaggedTensor(
        FEATURES,
        torch.from_numpy(k.T.reshape(-1).copy()),
        lengths=torch.ones(NS * B, dtype=torch.int64),
    )
    return dense, kjt


def model(tables=None, seed: int = 0, **kw) -> nn.Module:
    args = {**ARGS, **kw}
    return build_model("dlrm", tables or one_table(), ND, args, seed=seed)


def test_structure_names_and_logit_shape():
    m = model()
    assert isinstance(m, DLRM)
    names = [n for n, _ in m.named_parameters()]  # the dense part: rows are not parameters
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
    assert names == [n for n, _ in m.named_parameters()]  # the rows are not parameters
    assert list(m.embedding.parameters()) == []
    assert isinstance(m.bot[-1], nn.ReLU) and isinstance(m.top[-1], nn.Linear)
    assert m.top[-1].out_features == 1
    n = NS + 1
    assert m.top[0].in_features == DIM + n * (n - 1) // 2
    out = m(*inputs())
    assert out.shape == (B,) and out.dtype == torch.float32


def test_interaction_is_bottom_then_upper_triangle_dots():
    m = model()
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


def test_forward_is_the_formula_over_each_features_first_touch_row():
    """The collection hands the interaction feature f's row of sample b as ``emb[b, f]``:
    the row ``row_init`` makes for (seed, id, table t)."""
    m = dlrm(one_table(), ND, seed=7, **ARGS)
    dense, kjt = inputs()
    k = keys()
    rows = row_init(7, k.reshape(-1), DIM, default_init_scale(DIM), "t").reshape(B, NS, DIM)
    with torch.no_grad():
        want = m.top(m.interact(m.bot(dense), torch.from_numpy(rows))).squeeze(-1)
        got = m(dense, kjt)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_init_depends_only_on_the_seed_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a, b, c = model(seed=5), model(seed=5), model(seed=6)
    assert torch.equal(torch.rand(3), before), "build_model(seed=) must not use the caller's RNG"
    for (name, pa), (_, pb), (_, pc) in zip(
        a.named_parameters(), b.named_parameters(), c.named_parameters()
    ):
        assert torch.equal(pa, pb), name
        assert not torch.equal(pa, pc), name
    # Neither the tables' split, their widths nor their rows' seed moves bot and top.
    other = build_model("dlrm", mixed_tables(), ND, ARGS, seed=5)
    pa, po = dict(a.named_parameters()), dict(other.named_parameters())
    for name, p in pa.items():
        assert torch.equal(p, po[name]), name
    torch.manual_seed(5)
    again = dlrm(one_table(), ND, seed=0, **ARGS)
    torch.manual_seed(5)
    rowseed = dlrm(one_table(), ND, seed=99, **ARGS)
    for (name, p), (_, q) in zip(again.named_parameters(), rowseed.named_parameters()):
        assert torch.equal(p, q), name


def test_float64_model_casts_the_float32_rows_and_trains_them():
    m32, m64 = model(seed=1), model(seed=1).to(torch.float64)
    assert all(p.dtype == torch.float64 for p in m64.parameters())
    dense, kjt = inputs()
    out64 = m64(dense, kjt)
    assert out64.dtype == torch.float64
    torch.testing.assert_close(out64.float(), m32(dense, kjt), rtol=1e-5, atol=1e-6)
    out64.sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float64 for p in m64.parameters())
    updated = sparse_step(m64, lr=0.1)
    assert updated == {"embedding": {"t": len(np.unique(keys()))}}
    ids, rows = m64.embedding.table_rows()["t"]
    assert rows.dtype == np.float32
    assert not np.array_equal(rows, row_init(0, ids, DIM, default_init_scale(DIM), "t"))


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"bot_mlp": []}, "at least one positive width"),
        ({"bot_mlp": [8, 0]}, "at least one positive width"),
        ({"top_mlp": [8, 2]}, "last width must be 1"),
        ({"top_mlp": []}, "last width must be 1"),
    ],
)
def test_bad_widths_are_rejected(kw, match):
    args = {**ARGS, **kw}
    with pytest.raises(ValueError, match=match):
        DLRM(one_table(), ND, args["bot_mlp"], args["top_mlp"])
    # through the factory: a ModelError that names the model and keeps the cause
    with pytest.raises(ModelError, match=f"model 'dlrm'.*{match}"):
        build_model("dlrm", one_table(), ND, args)


def test_no_dense_features_is_rejected():
    with pytest.raises(ValueError, match="dense_features > 0"):
        DLRM(one_table(), 0, [DIM], [1])


def test_mixed_widths_go_through_projections_of_the_features_not_as_wide():
    m = model(mixed_tables(), seed=2)
    assert m.embedding.embedding_names() == ["f0", "f3", "f1", "f2", "f4"]
    proj = {n: tuple(p.shape) for n, p in m.named_parameters() if n.startswith("proj.")}
    # place i in the collection's output: 0, 1 narrow (2 -> DIM), 2 as wide as DIM, 3, 4 wide
    assert proj == {
        "proj.0.weight": (DIM, 2),
        "proj.1.weight": (DIM, 2),
        "proj.3.weight": (DIM, 16),
        "proj.4.weight": (DIM, 16),
    }
    assert all(p.bias is None for p in m.proj.values())
    dense, kjt = inputs()
    logits = m(dense, kjt)
    assert logits.shape == (B,)
    logits.sum().backward()
    for name in proj:
        assert dict(m.named_parameters())[name].grad.abs().sum() > 0, name
    updated = sparse_step(m, lr=0.1)["embedding"]
    k = keys()
    assert updated == {
        "narrow": len(np.unique(k[:, [0, 3]])),
        "same": len(np.unique(k[:, 1])),
        "wide": len(np.unique(k[:, [2, 4]])),
    }


def test_one_width_builds_no_projection_and_the_same_init():
    """Tables all as wide as the bottom MLP's output: no ``proj.*`` at all, and bot/top are
    the draws a mixed-width model of the same seed starts from (projections come last)."""
    plain = model(one_table(), seed=3)
    split = model(
        [
            EmbeddingBagConfig(0, DIM, "a", feature_names=["f0", "f1"]),
            EmbeddingBagConfig(0, DIM, "b", feature_names=["f2", "f3", "f4"]),
        ],
        seed=3,
    )
    mixed = model(mixed_tables(), seed=3)
    assert not any(n.startswith("proj.") for n, _ in plain.named_parameters())
    assert not any(n.startswith("proj.") for n, _ in split.named_parameters())
    assert len(plain.proj) == 0
    a, b, c = (dict(x.named_parameters()) for x in (plain, split, mixed))
    assert a.keys() == b.keys() < c.keys()
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=0, atol=0)
        torch.testing.assert_close(a[n], c[n], rtol=0, atol=0)
