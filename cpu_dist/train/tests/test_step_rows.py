"""StepRows, the row source a job gives its model's collections: bind a step's plans and
pulled rows, check the model looked up what was planned, collect the rows' gradients; and its
errors.  A model fed so computes what the same model computes on its own local rows, bit for
bit, for one-hot and multi-hot (weighted, mean-pooled) features."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from cpu_dist.common.contracts import row_init, sparse_update
from cpu_dist.embeddings import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    KeyedJaggedTensor,
    table_ids_of,
    unique_ids,
)
from cpu_dist.models import build_model
from cpu_dist.train.step_rows import StepRows, dense_named_parameters, distribute

pytestmark = pytest.mark.timeout(30)

DIM, ND, B, SEED, LR = 4, 3, 5, 11, 0.5
ARGS = {"bot_mlp": [8, DIM], "top_mlp": [6, 1]}


def one_hot_tables() -> list[EmbeddingBagConfig]:
    """Rows seeded by SEED, as a job's tables are by ``--seed`` (``job_model.model_tables``)."""
    return [
        EmbeddingBagConfig(0, DIM, "t0", feature_names=["a", "b"], seed=SEED),
        EmbeddingBagConfig(
            30, 2, "t1", feature_names=["c"], optimizer="rowwise_adagrad", seed=SEED
        ),
    ]


def multi_hot_tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(0, DIM, "t0", feature_names=["a", "b"], seed=SEED),
        EmbeddingBagConfig(30, 2, "t1", feature_names=["c"], pooling="mean", seed=SEED),
    ]


def one_hot(seed: int = 0) -> KeyedJaggedTensor:
    ids = np.random.default_rng(seed).integers(0, 30, 3 * B)
    ids[:3] = [1 << 40, 7, 7]  # a raw 64-bit id in t0 (num_embeddings 0) and repeats
    return KeyedJaggedTensor(
        ["a", "b", "c"], torch.from_numpy(ids), lengths=torch.ones(3 * B, dtype=torch.int64)
    )


def multi_hot(empty_c: bool = False) -> KeyedJaggedTensor:
    """Bags of 0..3 ids (some empty; every bag of ``c`` when ``empty_c``), weighted, the keys
    not in the tables' order."""
    g = np.random.default_rng(3)
    lengths = g.integers(0, 4, 3 * B)  # c: [3, 0, 0, 0, 0]
    if empty_c:
        lengths[:B] = 0
    values = g.integers(0, 30, int(lengths.sum()))
    weights = g.random(len(values), dtype=np.float32) + 0.5
    return KeyedJaggedTensor(
        ["c", "b", "a"],
        torch.from_numpy(values),
        weights=torch.from_numpy(weights),
        lengths=torch.from_numpy(lengths),
    )


def dense() -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(4).random((B, ND), dtype=np.float32))


def model(tables: list[EmbeddingBagConfig]) -> nn.Module:
    return build_model("dlrm", tables, ND, ARGS, seed=SEED)


def plans_of(kjt: KeyedJaggedTensor, tables: list[EmbeddingBagConfig]):
    """What the job's loader plans (``loop.plan_batch``)."""
    return {name: unique_ids(ids) for name, ids in table_ids_of(kjt, tables).items()}


def pulled(plans, tables: list[EmbeddingBagConfig]) -> dict[str, torch.Tensor]:
    """The rows a fresh shard gives for the plans: each table's salted first touch."""
    by_name = {t.name: t for t in tables}
    return {
        name: torch.from_numpy(
            row_init(SEED, unique, by_name[name].embedding_dim, by_name[name].init_scale, name)
        )
        for name, (unique, _) in plans.items()
    }


def bound(tables, kjt):
    """A distributed model with the step's plans and rows bound; returns (model, rows, plans)."""
    m = model(tables)
    source = distribute(m)
    plans = plans_of(kjt, tables)
    source.bind(plans, pulled(plans, tables))
    return m, source, plans


@pytest.mark.parametrize(
    "tables,kjt,t1_ids",
    [
        (one_hot_tables, one_hot, True),
        (multi_hot_tables, multi_hot, True),
        (multi_hot_tables, lambda: multi_hot(empty_c=True), False),
    ],
    ids=["one-hot", "multi-hot", "no-ids-of-t1"],
)
def test_a_step_on_bound_rows_equals_the_model_on_its_local_rows_bit_for_bit(tables, kjt, t1_ids):
    tables, kjt = tables(), kjt()
    local = model(tables)
    job, source, plans = bound(tables, kjt)
    x = dense()
    want, got = local(x, kjt), job(x, kjt)
    assert torch.equal(got, want)
    (want * torch.arange(1.0, B + 1)).sum().backward()
    (got * torch.arange(1.0, B + 1)).sum().backward()
    for (name, p), (_, q) in zip(local.named_parameters(), job.named_parameters()):
        assert torch.equal(p.grad, q.grad), name
    keys, grads = source.grads()
    assert keys.keys() == grads.keys() == {"t0", "t1"}
    assert (len(keys["t1"]) > 0) == t1_ids  # none: an empty update of t1 (shape [0, 2])
    # The commit's arithmetic on the job's gradients == the local collection's sparse step.
    local.embedding.sparse_step(LR)
    after = local.embedding.table_rows()
    for t in tables:
        unique, _ = plans[t.name]
        np.testing.assert_array_equal(keys[t.name], unique)
        assert grads[t.name].dtype == np.float32
        assert grads[t.name].shape == (len(unique), t.embedding_dim)
        if len(unique):  # (a table without ids this step commits an empty update)
            assert np.abs(grads[t.name]).max() > 0, t.name
        rows = source.rows()[t.name].numpy().copy()
        state = np.zeros(len(unique) if t.optimizer == "rowwise_adagrad" else 0, np.float32)
        sparse_update(t.optimizer, rows, state if len(state) else None, grads[t.name], LR)
        ids, values = after[t.name]
        np.testing.assert_array_equal(ids, unique)
        np.testing.assert_array_equal(values, rows, err_msg=t.name)


def test_bound_rows_under_no_grad_score_without_gradients():
    tables, kjt = one_hot_tables(), one_hot()
    local = model(tables)
    job, source, _ = bound(tables, kjt)
    with torch.no_grad():
        assert torch.equal(job(dense(), kjt), local(dense(), kjt))
    with pytest.raises(RuntimeError, match="table 't0': its rows got no gradient"):
        source.grads()


def test_distribute_gives_every_collection_one_shared_source():
    class TwoTowers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.users = EmbeddingBagCollection(one_hot_tables()[:1])
            self.head = nn.Sequential(nn.Linear(2, 1))
            self.items = nn.ModuleDict({"ebc": EmbeddingBagCollection(one_hot_tables()[1:])})

    m = TwoTowers()
    source = distribute(m)
    assert isinstance(source, StepRows)
    assert m.users.row_source is source and m.items["ebc"].row_source is source
    assert [n for n, _ in dense_named_parameters(m)] == ["head.0.weight", "head.0.bias"]
    with pytest.raises(ValueError, match="Sequential owns no EmbeddingBagCollection"):
        distribute(nn.Sequential(nn.Linear(2, 1)))


def test_a_plan_that_is_not_the_batchs_is_refused_naming_the_table():
    tables = one_hot_tables()
    m = model(tables)
    source = distribute(m)
    plans = plans_of(one_hot(seed=1), tables)  # another batch's plan, same sizes
    source.bind(plans, pulled(plans, tables))
    with pytest.raises(ValueError, match="table 't0': the model looked up 10 ids that are not"):
        m(dense(), one_hot(seed=0))


def test_a_table_looked_up_twice_in_one_binding_is_refused():
    tables, kjt = one_hot_tables(), one_hot()
    m, source, plans = bound(tables, kjt)
    m(dense(), kjt)
    with pytest.raises(RuntimeError, match="table 't0' was looked up twice in one step"):
        m(dense(), kjt)
    source.bind(plans, pulled(plans, tables))  # the next step's binding: fine again
    m(dense(), kjt).sum().backward()
    assert source.grads()[0].keys() == {"t0", "t1"}


def test_a_planned_table_the_model_did_not_use_has_no_gradient():
    tables, kjt = one_hot_tables(), one_hot()
    m = model(tables)
    source = distribute(m)
    plans = plans_of(kjt, tables)
    plans["extra"] = (np.array([1, 2]), np.array([0, 1, 1]))
    rows = pulled({k: v for k, v in plans.items() if k != "extra"}, tables)
    source.bind(plans, {**rows, "extra": torch.zeros(2, 3)})
    m(dense(), kjt).sum().backward()
    with pytest.raises(RuntimeError, match="table 'extra': its rows got no gradient"):
        source.grads()


def test_a_table_the_step_did_not_plan_is_refused():
    tables, kjt = one_hot_tables(), one_hot()
    m = model(tables)
    source = distribute(m)
    plans = {"t0": plans_of(kjt, tables)["t0"]}
    source.bind(plans, pulled(plans, tables))
    want = r"table 't1': no rows were read for it this step \(the step planned t0\)"
    with pytest.raises(KeyError, match=want):
        m(dense(), kjt)


def test_bind_refuses_a_plan_without_rows_and_lookup_rows_of_the_wrong_count():
    tables, kjt = one_hot_tables(), one_hot()
    plans = plans_of(kjt, tables)
    source = StepRows()
    with pytest.raises(KeyError, match="table 't1': planned but no rows were read"):
        source.bind(plans, {"t0": pulled(plans, tables)["t0"]})
    rows = pulled(plans, tables)
    rows["t1"] = rows["t1"][:-1]
    source.bind(plans, rows)
    unique = plans["t1"][0]
    with pytest.raises(ValueError, match=f"table 't1': {len(unique) - 1} rows read for"):
        source.lookup("t1", unique)
