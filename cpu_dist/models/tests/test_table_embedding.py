"""TableEmbedding: features in several tables give the model the features' vectors in the
data's order, so one fused table and a table per feature are the same model; mixed widths go
through DLRM's projections."""

import numpy as np
import pytest
import torch

from cpu_dist.common.contracts import row_init
from cpu_dist.models import ShardedEmbedding, build_dlrm
from cpu_dist.models.embedding import TableEmbedding

pytestmark = pytest.mark.timeout(30)

B, F = 4, 3


class Rows:
    """Rows of ``(table, key)`` from row_init, as a one-table and a tables store."""

    def __init__(self, dims: dict[str, int]) -> None:
        self.dims = dims

    def rows(self, table: str, keys: np.ndarray) -> np.ndarray:
        return row_init(3, keys, self.dims[table], 0.5, table)

    def pull_tables(self, parts):
        return {t: self.rows(t, k) for t, k in parts.items()}


def _keys() -> np.ndarray:
    return np.array([[5, 1, 5], [7, 5, 3], [3, 3, 1], [9, 7, 5]], dtype=np.int64)


def test_a_table_per_feature_equals_the_fused_table_holding_the_same_rows():
    keys = _keys()
    fused = keys + (np.arange(F, dtype=np.int64) << 32)[None, :]  # distinct per feature
    tables = [(f"t{f}", 4, [f]) for f in (2, 0, 1)]  # tables not in feature order
    store = Rows({name: 4 for name, _, _ in tables})
    emb = TableEmbedding(tables, F, store)
    per_table = {name: torch.from_numpy(keys[:, cols].copy()) for name, _, cols in tables}
    plans = emb.use_plan(per_table, emb.plan_keys({n: k.numpy() for n, k in per_table.items()}))
    got = emb(per_table, {n: store.rows(n, u) for n, u in plans.items()})

    # The same rows in one fused table: feature f's key (f << 32) | id holds table t_f's row.
    class Fused:
        def pull(self, k: np.ndarray) -> np.ndarray:
            return np.stack(
                [store.rows(f"t{int(x) >> 32}", np.array([int(x) & 0xFFFFFFFF]))[0] for x in k]
            )

    one = ShardedEmbedding(Fused(), 4)
    want = one(torch.from_numpy(fused))
    assert got.shape == (B, F, 4)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    (got * torch.arange(B * F * 4).reshape(B, F, 4)).sum().backward()
    (want * torch.arange(B * F * 4).reshape(B, F, 4)).sum().backward()
    tk, tg = emb.sparse_grads()
    fk, fg = one.sparse_grads()
    for f in range(F):
        mine = (fk >> 32) == f
        np.testing.assert_array_equal(tk[f"t{f}"], fk[mine] & 0xFFFFFFFF)
        np.testing.assert_array_equal(tg[f"t{f}"], fg[mine])


def test_mixed_widths_reach_the_interaction_through_projections():
    tables = [("narrow", 2, [0, 2]), ("wide", 16, [1])]
    store = Rows({"narrow": 2, "wide": 16})
    emb = TableEmbedding(tables, F, store)
    model = build_dlrm(
        emb,
        num_dense=2,
        num_sparse=F,
        dim=4,
        bot_mlp=[4],
        top_mlp=[8, 1],
        seed=0,
        feature_dims=emb.feature_dims,
    )
    assert emb.feature_dims == [2, 16, 2]
    names = [n for n, _ in model.dense_named_parameters()]
    assert {"proj.0.weight", "proj.1.weight", "proj.2.weight"} <= set(names)
    keys = _keys()
    per_table = {
        "narrow": torch.from_numpy(keys[:, [0, 2]].copy()),
        "wide": torch.from_numpy(keys[:, [1]].copy()),
    }
    logits = model(torch.ones(B, 2), per_table)
    assert logits.shape == (B,)
    logits.sum().backward()
    _, tg = emb.sparse_grads()
    assert tg["narrow"].shape == (len(np.unique(keys[:, [0, 2]])), 2)
    assert tg["wide"].shape == (len(np.unique(keys[:, 1])), 16)
    assert np.abs(tg["wide"]).sum() > 0


def test_one_width_builds_no_projection_and_todays_init():
    plain = build_dlrm(
        torch.nn.Identity(), num_dense=2, num_sparse=F, dim=4, bot_mlp=[4], top_mlp=[8, 1], seed=0
    )
    same = build_dlrm(
        torch.nn.Identity(),
        num_dense=2,
        num_sparse=F,
        dim=4,
        bot_mlp=[4],
        top_mlp=[8, 1],
        seed=0,
        feature_dims=[4, 4, 4],
    )
    a, b = dict(plain.dense_named_parameters()), dict(same.dense_named_parameters())
    assert a.keys() == b.keys()
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=0, atol=0)
