"""The built-in ``dcnv2`` model: the cross layer's formula, the shapes over mixed table widths,
a deterministic dense init that the collection does not disturb, and a local training step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from cpu_dist.embeddings import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    KeyedJaggedTensor,
    collections_of,
    sparse_step,
)
from cpu_dist.models.dcnv2 import DLRMDCNv2, LowRankCrossNet, dcnv2

pytestmark = pytest.mark.timeout(60)

SMALL = {"bot_mlp": [8, 4], "top_mlp": [6, 1], "num_layers": 2, "low_rank_dim": 3}


def tables(widths=(4, 16, 64), num_embeddings=0) -> list[EmbeddingBagConfig]:
    """One table per width; the first serves two features (shared rows), one is mean-pooled."""
    feats = [["a", "b"], ["c"], ["d"]]
    return [
        EmbeddingBagConfig(
            num_embeddings,
            w,
            f"t{i}",
            feature_names=feats[i],
            pooling="mean" if i == 1 else "sum",
        )
        for i, w in enumerate(widths)
    ]


def batch(n: int = 5, seed: int = 0) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    """``n`` samples of 3 dense features; multi-hot bags of 0..3 ids for a, b, c, d."""
    g = torch.Generator().manual_seed(seed)
    keys = ["d", "c", "b", "a", "unused"]  # not table order, one key the model ignores
    lengths = torch.randint(0, 4, (len(keys) * n,), generator=g)
    values = torch.randint(0, 50, (int(lengths.sum()),), generator=g)
    dense = torch.rand(n, 3, generator=g)
    return dense, KeyedJaggedTensor.from_lengths_sync(keys, values, lengths)


def test_cross_layer_is_x0_times_w_v_x_plus_b_plus_x():
    torch.manual_seed(0)
    cross = LowRankCrossNet(in_features=6, num_layers=2, low_rank=3)
    with torch.no_grad():
        for b in cross.bias:
            b.normal_()
    x0 = torch.rand(4, 6, dtype=torch.float64)
    cross.double()
    x = x0
    for w, v, b in zip(cross.W_kernels, cross.V_kernels, cross.bias):
        assert w.shape == (6, 3) and v.shape == (3, 6) and b.shape == (6,)
        x = x0 * ((w @ (v @ x.T)).T + b) + x  # written out, one sample per column
    torch.testing.assert_close(cross(x0), x, rtol=1e-12, atol=1e-12)
    names = [n for n, _ in cross.named_parameters()]
    assert names[:2] == ["W_kernels.0", "W_kernels.1"] and "bias.1" in names  # TorchRec's


def test_mixed_widths_4_16_64_concat_feeds_the_cross_net_and_logits_are_per_sample():
    model = dcnv2(tables(), 3, **SMALL)
    # the cross net's width: bottom output 4 + features a, b (4 each), c (16), d (64)
    assert model.crossnet.in_features == 4 + 4 + 4 + 16 + 64
    assert model.top[0].in_features == model.crossnet.in_features
    dense, kjt = batch()
    logits = model(dense, kjt)
    assert logits.shape == (5,) and torch.isfinite(logits).all()


def test_default_bottom_mlp_ends_in_the_table_width_or_the_widest():
    one = dcnv2(tables((16, 16, 16)), 3, top_mlp=[1], low_rank_dim=2)
    assert [m.out_features for m in one.bot if isinstance(m, nn.Linear)] == [512, 256, 16]
    mixed = dcnv2(tables(), 3, top_mlp=[1], low_rank_dim=2)
    assert [m.out_features for m in mixed.bot if isinstance(m, nn.Linear)][-1] == 64
    assert one.crossnet.num_layers == 3 and one.crossnet.low_rank == 2


def test_no_dropout_no_batch_norm_one_collection_of_the_tables():
    model = dcnv2(tables(), 3, **SMALL)
    kinds = {type(m) for m in model.modules()}
    assert not kinds & {nn.Dropout, nn.BatchNorm1d, nn.LayerNorm}
    found = collections_of(model)
    assert [n for n, _ in found] == ["sparse_arch"]
    assert found[0][1].embedding_bag_configs() == tables()
    assert all(not n.startswith("sparse_arch") for n, _ in model.named_parameters())


def test_init_is_deterministic_and_the_collection_draws_no_torch_random_numbers():
    torch.manual_seed(11)
    before = torch.get_rng_state()
    EmbeddingBagCollection(tables(num_embeddings=10**9))
    assert torch.equal(torch.get_rng_state(), before)

    def build(num_embeddings: int, seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return dcnv2(tables(num_embeddings=num_embeddings), 3, **SMALL).state_dict()

    lazy, sized, other = build(0, 11), build(10**9, 11), build(0, 12)
    assert lazy.keys() == sized.keys()
    assert all(torch.equal(lazy[k], sized[k]) for k in lazy)  # a billion rows drew nothing
    assert not torch.equal(lazy["crossnet.W_kernels.0"], other["crossnet.W_kernels.0"])


def test_bad_arguments_name_what_is_wrong():
    with pytest.raises(ValueError, match=r"top_mlp \[6, 2\]: the last width must be 1"):
        dcnv2(tables(), 3, top_mlp=[6, 2])
    with pytest.raises(ValueError, match=r"bot_mlp \[\]"):
        dcnv2(tables(), 3, bot_mlp=[])
    with pytest.raises(ValueError, match=r"low_rank_dim 0"):
        dcnv2(tables(), 3, low_rank_dim=0)
    with pytest.raises(ValueError, match=r"dense_features 0"):
        dcnv2(tables(), 0)
    model = dcnv2(tables(), 3, **SMALL)
    dense, kjt = batch()
    with pytest.raises(ValueError, match=r"dense \(5, 4\): expected \[B, 3\]"):
        model(torch.rand(5, 4), kjt)
    with pytest.raises(ValueError, match=r"sparse features hold 5 samples, dense 2"):
        model(dense[:2], kjt)


def test_a_local_step_moves_dense_and_touched_rows_and_lowers_the_loss():
    torch.manual_seed(0)
    model: DLRMDCNv2 = dcnv2(tables(), 3, **SMALL)
    dense, kjt = batch(n=16, seed=1)
    labels = (dense[:, 0] > 0.5).float()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.BCEWithLogitsLoss()
    losses = []
    for _ in range(8):
        opt.zero_grad()
        loss = loss_fn(model(dense, kjt), labels)
        loss.backward()
        opt.step()
        updated = sparse_step(model, lr=0.05)
        losses.append(loss.item())
    assert updated["sparse_arch"]["t2"] > 0  # rows of the 64-wide table were trained
    assert losses[-1] < losses[0]


def test_float64_dense_layers_take_the_float32_rows_and_train_them():
    model = dcnv2(tables(), 3, **SMALL).double()
    dense, kjt = batch()
    logits = model(dense, kjt)  # float32 dense inputs too: cast to the layers' dtype
    assert logits.dtype == torch.float64
    logits.sum().backward()
    updated = sparse_step(model)["sparse_arch"]
    assert set(updated) == {"t0", "t1", "t2"} and min(updated.values()) > 0
    rows = model.sparse_arch.table_rows()
    assert all(r.dtype == np.float32 for _, r in rows.values())  # rows stay float32
