"""The single-process reference against a step computed by hand, and a learning check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpu_dist.common.contracts import row_init
from cpu_dist.data import Batch, SyntheticCriteo
from cpu_dist.models import build_dlrm
from cpu_dist.models.scoring import evaluate
from cpu_dist.train.reference import (
    LocalEmbedding,
    ReferenceTrainer,
    train_reference,
)

pytestmark = pytest.mark.timeout(60)

DIM, ND, NS = 3, 2, 2
BOT, TOP = [DIM], [8, 1]


class ListDataset:
    """Fixed global batches, as a Dataset."""

    kind, num_dense, num_sparse = "list", ND, NS

    def __init__(self, batches: list[Batch]) -> None:
        self.batches = batches

    def train_batches(self, batch_size, start_step=0):
        for step in range(start_step, len(self.batches)):
            assert len(self.batches[step]) == batch_size
            yield step, self.batches[step]

    def eval_batches(self, batch_size, num_batches):
        return iter(())


def _batches() -> list[Batch]:
    g = np.random.default_rng(0)
    out = []
    for keys in ([[10, 1 << 33], [10, 7]], [[7, 7], [11, 1 << 33]], [[10, 12], [11, 7]]):
        out.append(
            Batch(
                dense=g.random((2, ND), dtype=np.float32),
                keys=np.array(keys, dtype=np.int64),
                labels=np.array([1.0, 0.0], dtype=np.float32),
            )
        )
    return out


def _hand_train(batches, *, lr, sparse_lr, dense_opt, sparse_opt, scale, init_seed, seed):
    """The reference's contract written out directly: explicit DLRM formula, explicit updates."""
    init = build_dlrm(
        torch.nn.Identity(),
        num_dense=ND,
        num_sparse=NS,
        dim=DIM,
        bot_mlp=BOT,
        top_mlp=TOP,
        seed=seed,
    )
    p = {n: t.detach().double().numpy().copy() for n, t in init.dense_named_parameters()}
    rows: dict[int, np.ndarray] = {}
    accum: dict[int, np.float32] = {}
    adam = {n: (np.zeros_like(v), np.zeros_like(v)) for n, v in p.items()}
    for t, b in enumerate(batches, 1):
        uniq = np.unique(b.keys)
        for k in uniq.tolist():
            if k not in rows:
                rows[k] = row_init(init_seed, np.array([k]), DIM, scale)[0]
                accum[k] = np.float32(0)
        tp = {n: torch.tensor(v, requires_grad=True) for n, v in p.items()}
        trow = torch.tensor(
            np.stack([rows[k] for k in uniq.tolist()]).astype(np.float64), requires_grad=True
        )
        emb = trow[torch.from_numpy(np.searchsorted(uniq, b.keys))]  # [B, F, D]
        x = torch.from_numpy(b.dense).double()
        bottom = torch.relu(x @ tp["bot.0.weight"].T + tp["bot.0.bias"])
        vecs = [bottom] + [emb[:, f] for f in range(NS)]
        dots = [(vecs[i] * vecs[j]).sum(1) for i in range(NS + 1) for j in range(i + 1, NS + 1)]
        z = torch.cat([bottom, torch.stack(dots, 1)], 1)
        h = torch.relu(z @ tp["top.0.weight"].T + tp["top.0.bias"])
        logit = (h @ tp["top.2.weight"].T + tp["top.2.bias"])[:, 0]
        y = torch.from_numpy(b.labels).double()
        loss = -(
            y * torch.log(torch.sigmoid(logit)) + (1 - y) * torch.log(1 - torch.sigmoid(logit))
        ).mean()
        loss.backward()
        for n in p:
            g = tp[n].grad.numpy()
            if dense_opt == "sgd":
                p[n] = p[n] - lr * g
            else:  # AdamW, torch defaults: betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2
                m, v = adam[n]
                m = 0.9 * m + 0.1 * g
                v = 0.999 * v + 0.001 * g * g
                adam[n] = (m, v)
                p[n] = p[n] * (1 - lr * 1e-2) - lr * (m / (1 - 0.9**t)) / (
                    np.sqrt(v / (1 - 0.999**t)) + 1e-8
                )
        for i, k in enumerate(uniq.tolist()):
            g = trow.grad[i].numpy().astype(np.float32)
            if sparse_opt == "sgd":
                rows[k] = rows[k] - np.float32(sparse_lr) * g
            else:
                accum[k] = np.float32(accum[k] + np.float32(np.mean(g.astype(np.float64) ** 2)))
                rows[k] = rows[k] - np.float32(sparse_lr / (np.sqrt(accum[k]) + 1e-8)) * g
    keys = np.array(sorted(rows), dtype=np.int64)
    return p, keys, np.stack([rows[k] for k in keys.tolist()])


def _run(batches, steps, **kw):
    return train_reference(
        dataset=ListDataset(batches),
        steps=steps,
        batch_size=2,
        dim=DIM,
        bot_mlp=BOT,
        top_mlp=TOP,
        seed=4,
        init_seed=5,
        init_scale=0.5,
        **kw,
    )


@pytest.mark.parametrize(
    "dense_opt,sparse_opt,lr,sparse_lr",
    [
        ("sgd", "sgd", 0.5, None),
        ("adamw", "rowwise_adagrad", 0.01, 0.3),
        ("sgd", "rowwise_adagrad", 0.2, 0.1),
    ],
)
@pytest.mark.parametrize("steps", [1, 3])
def test_matches_hand_computed_steps(dense_opt, sparse_opt, lr, sparse_lr, steps):
    batches = _batches()
    got = _run(
        batches,
        steps,
        lr=lr,
        sparse_lr=sparse_lr,
        dense_optimizer=dense_opt,
        sparse_optimizer=sparse_opt,
    )
    p, keys, values = _hand_train(
        batches[:steps],
        lr=lr,
        sparse_lr=lr if sparse_lr is None else sparse_lr,
        dense_opt=dense_opt,
        sparse_opt=sparse_opt,
        scale=0.5,
        init_seed=5,
        seed=4,
    )
    assert sorted(k for k in got if k.startswith("dense/")) == sorted(f"dense/{n}" for n in p)
    for n, v in p.items():
        assert got[f"dense/{n}"].dtype == np.float32
        np.testing.assert_allclose(got[f"dense/{n}"], v, rtol=2e-5, atol=2e-6, err_msg=n)
    np.testing.assert_array_equal(got["table/embedding/keys"], keys)
    assert got["table/embedding/values"].dtype == np.float32
    np.testing.assert_allclose(got["table/embedding/values"], values, rtol=2e-5, atol=2e-6)
    # The updates really moved every row (a dead-ReLU init would make this test vacuous).
    moved = got["table/embedding/values"] - row_init(5, keys, DIM, 0.5)
    assert np.all(np.abs(moved).max(axis=1) > 1e-4)


def test_float64_dense_keeps_float32_rows():
    batches = _batches()
    kw = dict(lr=0.5, sparse_lr=None, dense_optimizer="sgd", sparse_optimizer="rowwise_adagrad")
    d32 = _run(batches, 3, **kw)
    d64 = _run(batches, 3, dtype=torch.float64, **kw)
    assert d64["dense/top.2.weight"].dtype == np.float64
    assert d64["table/embedding/values"].dtype == np.float32
    for k in d32:
        np.testing.assert_allclose(d64[k], d32[k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_start_step_trains_the_later_batches():
    batches = _batches()
    got = _run(
        batches,
        1,
        lr=0.1,
        sparse_lr=None,
        dense_optimizer="sgd",
        sparse_optimizer="sgd",
        start_step=2,
    )
    np.testing.assert_array_equal(got["table/embedding/keys"], np.unique(batches[2].keys))


def test_local_embedding_reads_unseen_keys_as_first_touch_rows_only_without_grad():
    keys = np.array([2, 9], dtype=np.int64)
    emb = LocalEmbedding(keys, row_init(1, keys, DIM, 0.5), init_seed=1, init_scale=0.5)
    q = torch.tensor([[9, 4]])
    with torch.no_grad():
        out = emb(q)
    np.testing.assert_array_equal(out[0].numpy(), row_init(1, np.array([9, 4]), DIM, 0.5))
    with pytest.raises(KeyError):
        emb(q)


def test_reference_learns_the_synthetic_task():
    data = SyntheticCriteo(
        cardinalities=[10, 100, 1000, 5000, 20000, 300, 50, 2000], num_sparse=8, seed=1
    )
    steps, bs = 60, 1024
    keys = np.unique(np.concatenate([data.global_batch(s, bs).keys.ravel() for s in range(steps)]))
    tr = ReferenceTrainer(
        keys=keys,
        num_dense=13,
        num_sparse=8,
        dim=8,
        bot_mlp=[32, 8],
        top_mlp=[32, 1],
        seed=0,
        lr=0.1,
        sparse_lr=0.05,
        dense_optimizer="sgd",
        sparse_optimizer="rowwise_adagrad",
        init_scale=0.1,
        init_seed=0,
    )
    ev = data.global_batch(0, 4096, "eval")
    before = evaluate(tr.predict(ev), ev.labels)
    losses = [tr.step(data.global_batch(s, bs)) for s in range(steps)]
    after = evaluate(tr.predict(ev), ev.labels)
    assert after["auc"] > 0.7 > before["auc"] + 0.1
    assert after["logloss"] < before["logloss"]
    assert np.mean(losses[-10:]) < np.mean(losses[:10])


def test_table_rules_admit_on_the_nth_step_and_expire_idle_rows():
    from cpu_dist.train.reference import TableRules

    rules = TableRules(4, admit_after=2, expire_after=2)
    k = lambda *xs: np.array(xs, dtype=np.int64)  # noqa: E731
    assert not rules.admitted(0, k(0, 1)).any()  # counts 1, 1: gradients dropped
    assert rules.admitted(1, k(1, 2)).tolist() == [True, False]  # key 1 reaches 2
    assert rules.expired(1).tolist() == []
    assert rules.admitted(2, k(0)).tolist() == [True]
    assert rules.expired(2).tolist() == []  # horizon 0: nothing last updated at 0
    assert rules.held.tolist() == [True, True, False, False]
    assert rules.expired(3).tolist() == [1]  # last update 1 <= 3 - 2: dropped
    assert rules.count.tolist() == [2, 0, 0, 0]  # key 2's idle count went too (seen at 1)
    assert rules.admitted(4, k(1, 2)).tolist() == [False, False]  # counting starts again
    assert rules.held.tolist() == [True, False, False, False]


def test_rules_off_keep_every_row_that_was_trained():
    from cpu_dist.train.reference import TableRules

    rules = TableRules(3)
    assert rules.admitted(0, np.array([0, 2])).all()
    assert rules.expired(50).tolist() == [] and rules.held.tolist() == [True, False, True]


def _spec(name, dim=DIM, optimizer="sgd", **kw):
    spec = dict(
        name=name,
        dim=dim,
        optimizer=optimizer,
        init_scale=0.5,
        seed=5,
        num_embeddings=0,
        admit_after=0,
        expire_after=0,
        eps=1e-8 if optimizer == "adagrad" else 0.0,
    )
    spec.update(kw)
    return spec


def _tables_run(batches, steps, tables, columns, **kw):
    from cpu_dist.data.keys import TableKeySplit

    split = TableKeySplit(columns, offsets=np.zeros(NS, np.int64))  # ids = the list's keys
    return _run(
        batches,
        steps,
        lr=0.2,
        sparse_lr=None,
        dense_optimizer="sgd",
        sparse_optimizer="sgd",
        tables=tables,
        split=split,
        **kw,
    )


@pytest.mark.parametrize("sparse_opt", ["sgd", "rowwise_adagrad"])
def test_one_named_table_of_every_feature_is_the_fused_reference(sparse_opt):
    """Through the tables path (split, features reordered back from the table's order), the
    table named like the default one holds the same rows and trains the same bits."""
    from cpu_dist.train.reference import ReferenceTable

    batches = _batches()
    want = _run(
        batches, 3, lr=0.2, sparse_lr=0.3, dense_optimizer="sgd", sparse_optimizer=sparse_opt
    )
    table = ReferenceTable(_spec("embedding", optimizer=sparse_opt), 0.3)
    got = _tables_run(batches, 3, [table], {"embedding": [1, 0]})
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_tables_have_their_own_salted_rows_widths_and_optimizers():
    from cpu_dist.train.reference import ReferenceTable

    batches = _batches()
    tables = [
        ReferenceTable(_spec("a", dim=2, optimizer="rowwise_adagrad", seed=9), 0.1),
        ReferenceTable(_spec("b", dim=5, init_scale=0.25), 0.4),
    ]
    first = _tables_run(batches, 1, tables, {"a": [0], "b": [1]})
    assert first["table/a/values"].shape == (len(np.unique(batches[0].keys[:, 0])), 2)
    np.testing.assert_array_equal(first["table/b/keys"], np.unique(batches[0].keys[:, 1]))
    # one SGD step moved table b's rows away from their salted first-touch values by lr * g
    b_keys = first["table/b/keys"]
    moved = first["table/b/values"] - row_init(5, b_keys, 5, 0.25, "b")
    assert np.all(np.abs(moved).max(axis=1) > 1e-5)
    assert np.all(np.abs(moved).max(axis=1) < 0.4)
    # the model projects the mixed widths: proj.<f> for both features
    assert {"dense/proj.0.weight", "dense/proj.1.weight"} <= set(first)


def test_an_adagrad_tables_first_step_moves_each_element_by_about_lr():
    """Element-wise Adagrad: acc = g*g, so the first step is w -= lr * g / (|g| + eps), about
    lr * sign(g) wherever g is not tiny; its state is [n, dim]."""
    from cpu_dist.train.reference import ReferenceTable, ReferenceTrainer

    batches = _batches()
    table = ReferenceTable(_spec("embedding", dim=DIM, optimizer="adagrad"), 0.01)
    from cpu_dist.data.keys import TableKeySplit

    split = TableKeySplit({"embedding": [0, 1]}, offsets=np.zeros(NS, np.int64))
    keys = np.unique(batches[0].keys)
    tr = ReferenceTrainer(
        keys={"embedding": keys},
        num_dense=ND,
        num_sparse=NS,
        dim=DIM,
        bot_mlp=BOT,
        top_mlp=TOP,
        seed=4,
        lr=0.2,
        sparse_lr=None,
        dense_optimizer="sgd",
        sparse_optimizer="sgd",
        init_scale=0.5,
        init_seed=5,
        tables=[table],
        split=split,
    )
    tr.step(batches[0])
    (state,) = [t.state for t in tr.tables]
    assert state.shape == (len(keys), DIM)
    moved = tr.dump()["table/embedding/values"] - row_init(5, keys, DIM, 0.5, "embedding")
    big = state > 1e-6  # |g| > 1e-3: the step is lr * |g| / (|g| + 1e-8) ~ lr
    assert big.sum() > 0
    np.testing.assert_allclose(np.abs(moved[big]), 0.01, rtol=1e-4)
    np.testing.assert_array_equal(moved[state == 0], 0)
