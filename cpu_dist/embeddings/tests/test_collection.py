"""EmbeddingBagCollection outside a job: pooling against a plain torch loop, lazy rows equal
to ``row_init``, shared tables, no torch random numbers, and training steps equal to
``contracts.sparse_update`` for each optimizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpu_dist.common.contracts import row_init, sparse_update, state_floats
from cpu_dist.embeddings import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    KeyedJaggedTensor,
    collections_of,
    pool_bags,
    sparse_step,
)

pytestmark = pytest.mark.timeout(60)

T = torch.tensor
SEED = 3


def tables(optimizer: str = "sgd") -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            0,
            4,
            "items",
            feature_names=["clicked", "bought"],
            pooling="sum",
            optimizer=optimizer,
            lr=0.3,
        ),
        EmbeddingBagConfig(
            20, 3, "query", feature_names=["query"], pooling="mean", optimizer=optimizer, lr=0.2
        ),
    ]


def batch(weighted: bool = True) -> KeyedJaggedTensor:
    """Three samples, key-major; an extra key ("other") and keys out of table order."""
    bags = {
        "query": [[1, 5, 5], [], [19]],
        "other": [[8], [9], []],
        "bought": [[-2, 11], [7], []],
        "clicked": [[7, 7, 40], [], [2**40]],
    }
    keys = list(bags)
    values = [i for k in keys for bag in bags[k] for i in bag]
    lengths = [len(bag) for k in keys for bag in bags[k]]
    weights = T([0.5 + 0.25 * i for i in range(len(values))]) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys, T(values), T(lengths), weights=weights)


def loop_pool(kjt: KeyedJaggedTensor, configs, rows_of, weighted: bool) -> dict[str, torch.Tensor]:
    """The plain reference: every bag, every id, one row at a time."""
    out = {}
    for c in configs:
        for f in c.feature_names:
            jt = kjt[f]
            w = jt.weights_or_none() if weighted else None
            per_bag = []
            at = 0
            for bag in jt.to_dense():
                acc = torch.zeros(c.embedding_dim, dtype=torch.float32)
                for j, i in enumerate(bag.tolist()):
                    weight = 1.0 if w is None else float(w[at + j])
                    acc = acc + weight * rows_of(c, i)
                if c.pooling.mode == "mean" and len(bag):
                    acc = acc / len(bag)
                per_bag.append(acc)
                at += len(bag)
            out[f] = torch.stack(per_bag)
    return out


def first_touch(c: EmbeddingBagConfig, i: int) -> torch.Tensor:
    return torch.from_numpy(row_init(SEED, np.array([i]), c.embedding_dim, c.init_scale, c.name)[0])


@pytest.mark.parametrize("weighted", [True, False])
def test_pooling_equals_a_plain_loop_sum_mean_weighted_and_empty_bags(weighted):
    ebc = EmbeddingBagCollection(tables(), seed=SEED)
    kjt = batch(weighted)
    kt = ebc(kjt)
    assert kt.keys() == ["clicked", "bought", "query"]  # tables, then their feature_names
    assert kt.length_per_key() == [4, 4, 3] and kt.values().shape == (3, 11)
    expected = loop_pool(kjt, ebc.embedding_bag_configs(), first_touch, weighted)
    for f, want in expected.items():
        torch.testing.assert_close(kt[f], want, rtol=1e-6, atol=1e-7)
    assert torch.equal(kt["query"][1], torch.zeros(3))  # an empty mean bag
    assert torch.equal(kt["bought"][2], torch.zeros(4))  # an empty sum bag


def test_is_weighted_false_ignores_weights_and_true_requires_them():
    weighted, plain = batch(True), batch(False)
    ignoring = EmbeddingBagCollection(tables(), is_weighted=False, seed=SEED)
    default = EmbeddingBagCollection(tables(), seed=SEED)
    assert torch.equal(ignoring(weighted).values(), default(plain).values())
    assert not torch.equal(default(weighted).values(), default(plain).values())
    with pytest.raises(ValueError, match=r"is_weighted=True.*no weights"):
        EmbeddingBagCollection(tables(), is_weighted=True)(plain)


def test_lazy_rows_are_row_init_and_only_touched_ones_exist():
    ebc = EmbeddingBagCollection(tables(), seed=SEED)
    with torch.no_grad():
        ebc(batch())
    assert all(len(ids) == 0 for ids, _ in ebc.table_rows().values())  # reads create nothing
    ebc(batch())
    held = ebc.table_rows()
    items = np.array(sorted({7, 40, 2**40, -2, 11}), dtype=np.int64)
    assert np.array_equal(held["items"][0], items)
    assert np.array_equal(held["query"][0], [1, 5, 19])
    for c in ebc.embedding_bag_configs():
        ids, rows = held[c.name]
        assert np.array_equal(rows, row_init(SEED, ids, c.embedding_dim, c.init_scale, c.name))
    # a negative id is its unsigned bit pattern, as the shards key it
    unsigned = np.array([2**64 - 2], dtype=np.uint64).view(np.int64)
    assert np.array_equal(
        row_init(SEED, unsigned, 4, 0.5, "items"), row_init(SEED, [-2], 4, 0.5, "items")
    )


def test_features_of_one_table_share_its_rows():
    config = EmbeddingBagConfig(0, 2, "t", feature_names=["a", "b"])
    ebc = EmbeddingBagCollection([config])
    kjt = KeyedJaggedTensor.from_lengths_sync(["a", "b"], T([9, 9]), T([1, 1]))
    kt = ebc(kjt)
    assert torch.equal(kt["a"], kt["b"])
    assert len(ebc.table_rows()["t"][0]) == 1
    kt["a"].sum().backward()  # only feature a's use of the row
    ebc.sparse_step()
    after = ebc(kjt)
    assert torch.equal(after["a"], after["b"]) and not torch.equal(after["a"], kt["a"])


def test_building_and_running_consume_no_torch_random_numbers():
    before = torch.get_rng_state()
    ebc = EmbeddingBagCollection(tables())
    ebc(batch()).values().sum().backward()
    ebc.sparse_step()
    assert torch.equal(torch.get_rng_state(), before)


def _loss_weights(width: int) -> torch.Tensor:
    return torch.linspace(-1.0, 1.5, 3 * width).reshape(3, width)


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad", "adagrad"])
def test_training_steps_equal_sparse_update(optimizer):
    configs = tables(optimizer)
    ebc = EmbeddingBagCollection(configs, seed=SEED)
    kjt = batch()
    # The oracle: each table's unique rows as a dense leaf, the plain loop, sparse_update.
    ids = {"items": np.array([-2, 7, 11, 40, 2**40]), "query": np.array([1, 5, 19])}
    ids = {n: np.sort(v.astype(np.int64)) for n, v in ids.items()}
    rows = {
        c.name: row_init(SEED, ids[c.name], c.embedding_dim, c.init_scale, c.name) for c in configs
    }
    state = {
        c.name: np.zeros(
            (len(ids[c.name]), c.embedding_dim)
            if state_floats(optimizer, c.embedding_dim) > 1
            else len(ids[c.name]),
            dtype=np.float32,
        )
        for c in configs
    }
    for _ in range(2):  # the second step reads the first's optimizer state
        kt = ebc(kjt)
        (kt.values() * _loss_weights(11)).sum().backward()
        assert ebc.sparse_step() == {"items": 5, "query": 3}
        leaves = {n: torch.from_numpy(r.copy()).requires_grad_(True) for n, r in rows.items()}
        by = {c.name: c for c in configs}

        def of(c, i, leaves=leaves):
            return leaves[c.name][int(np.searchsorted(ids[c.name], i))]

        ref = loop_pool(kjt, configs, of, True)
        (torch.cat([ref[f] for f in kt.keys()], 1) * _loss_weights(11)).sum().backward()
        for n in rows:
            extra = {"eps": by[n].eps} if optimizer == "adagrad" else {}
            sparse_update(optimizer, rows[n], state[n], leaves[n].grad.numpy(), by[n].lr, **extra)
        held = ebc.table_rows()
        for n in rows:
            assert np.array_equal(held[n][0], ids[n])
            np.testing.assert_allclose(held[n][1], rows[n], rtol=1e-5, atol=1e-7)
    assert not np.array_equal(
        rows["items"], row_init(SEED, ids["items"], 4, configs[0].init_scale, "items")
    )


def test_two_forwards_before_a_step_sum_their_gradients_and_lr_overrides():
    config = EmbeddingBagConfig(0, 2, "t", feature_names=["a"], lr=0.5)
    ebc = EmbeddingBagCollection([config])
    kjt = KeyedJaggedTensor.from_lengths_sync(["a"], T([4]), T([1]))
    start = ebc.table_rows()["t"][1] if len(ebc.table_rows()["t"][0]) else None
    assert start is None
    for _ in range(2):
        ebc(kjt).values().sum().backward()
    assert ebc.sparse_step(lr=0.1) == {"t": 1}
    first = row_init(0, [4], 2, config.init_scale, "t")
    expected = first - np.float32(0.1) * np.float32(2.0)
    np.testing.assert_array_equal(ebc.table_rows()["t"][1], expected)


class PulledRows:
    """A stand-in for the PS-fed row source: it hands out rows it was given."""

    def __init__(self, rows: dict[str, dict[int, np.ndarray]]):
        self.rows = rows

    def lookup(self, table, ids):
        return torch.from_numpy(np.stack([self.rows[table][int(i)] for i in ids]))


def test_another_row_source_pools_to_the_same_bits():
    local = EmbeddingBagCollection(tables(), seed=SEED)
    want = local(batch())
    held = local.table_rows()
    fed = EmbeddingBagCollection(tables(), seed=SEED)
    fed.set_row_source(PulledRows({n: dict(zip(i.tolist(), r)) for n, (i, r) in held.items()}))
    assert torch.equal(fed(batch()).values(), want.values())
    with pytest.raises(RuntimeError, match="not local"):
        fed.sparse_step()
    with pytest.raises(TypeError, match="not a RowSource"):
        fed.set_row_source(object())  # type: ignore[arg-type]


def test_pool_bags_by_hand():
    rows = T([[1.0, 0.0], [0.0, 2.0]])
    idx, off = T([0, 1, 1]), T([0, 2, 2, 3])
    assert pool_bags(rows, idx, off, None, "mean").tolist() == [[0.5, 1.0], [0.0, 0.0], [0.0, 2.0]]
    w = T([2.0, 1.0, 3.0])
    assert pool_bags(rows, idx, off, w, "sum").tolist() == [[2.0, 2.0], [0.0, 0.0], [0.0, 6.0]]
    assert pool_bags(rows, idx, off, w, "mean").tolist() == [[1.0, 1.0], [0.0, 0.0], [0.0, 6.0]]
    with pytest.raises(ValueError, match="pooling mode 'max'"):
        pool_bags(rows, idx, off, None, "max")


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_pool_bags_gradient_is_autograds_own(mode, weighted):
    """The scattered backward (one index_add_) gives the rows the gradient autograd's
    embedding_bag gives them: empty bags, repeated ids, a bag of most of the values."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(50, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    idx = torch.randint(0, 50, (300,), generator=gen)
    off = T([0, 3, 3, 10, 100, 250, 300])
    w = torch.rand(300, dtype=torch.float64, generator=gen) if weighted else None
    pooled = pool_bags(rows, idx, off, w, mode)
    grad = torch.randn(pooled.shape, dtype=torch.float64, generator=gen)
    (ours,) = torch.autograd.grad(pooled, rows, grad)
    ref = torch.nn.functional.embedding_bag(
        idx, rows, off, mode="sum", per_sample_weights=w, include_last_offset=True
    )
    if mode == "mean":
        ref = ref / (off[1:] - off[:-1]).clamp(min=1).unsqueeze(1)
    (theirs,) = torch.autograd.grad(ref, rows, grad)
    assert torch.equal(pooled, ref)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    assert ours.abs().sum() > 0


def test_errors_name_the_feature_table_and_id():
    ebc = EmbeddingBagCollection(tables())
    short = KeyedJaggedTensor.from_lengths_sync(["clicked", "query"], T([1, 2]), T([1, 1]))
    with pytest.raises(
        KeyError,
        match=r"feature 'bought' is not in the KeyedJaggedTensor \(its keys: clicked, query\)",
    ):
        ebc(short)
    bad = KeyedJaggedTensor.from_lengths_sync(
        ["clicked", "bought", "query"], T([1, 2, 20]), T([1, 1, 1])
    )
    with pytest.raises(
        ValueError, match=r"feature 'query': id 20 is outside table 'query''s \[0, 20\)"
    ):
        ebc(bad)
    negative = KeyedJaggedTensor.from_lengths_sync(
        ["clicked", "bought", "query"], T([1, 2, -1]), T([1, 1, 1])
    )
    with pytest.raises(ValueError, match=r"feature 'query': id -1 is outside"):
        ebc(negative)
    floats = KeyedJaggedTensor.from_lengths_sync(
        ["clicked", "bought", "query"], T([1.0, 2.0, 1.0]), T([1, 1, 1])
    )
    with pytest.raises(TypeError, match=r"feature 'clicked': ids must be integers"):
        ebc(floats)
    a = EmbeddingBagConfig(0, 4, "a", feature_names=["f"])
    with pytest.raises(ValueError, match=r"feature 'f' is in table 'a' and in 'b'"):
        EmbeddingBagCollection([a, EmbeddingBagConfig(0, 4, "b", feature_names=["f"])])
    with pytest.raises(ValueError, match=r"two tables are named 'a'"):
        EmbeddingBagCollection([a, EmbeddingBagConfig(0, 4, "a", feature_names=["g"])])
    with pytest.raises(ValueError, match="non-empty list"):
        EmbeddingBagCollection([])


def test_a_local_step_applies_the_tables_rules():
    """The parameter server's admission, locally (test_rows_rules.py: every rule against the
    reference's oracle): the row is held and trained from its second step on."""
    ruled = EmbeddingBagConfig(0, 2, "t", feature_names=["a"], admit_after=2)
    ebc = EmbeddingBagCollection([ruled])
    kjt = KeyedJaggedTensor.from_lengths_sync(["a"], T([1]), T([1]))
    for step in range(2):
        ebc(kjt).values().sum().backward()
        assert ebc.sparse_step() == {"t": step}
        assert len(ebc.table_rows()["t"][0]) == step


class TorchRecConfig:
    """torchrec.modules.embedding_configs.EmbeddingBagConfig's fields, as an object."""

    def __init__(self):
        self.num_embeddings, self.embedding_dim, self.name = 10, 2, "tr"
        self.feature_names = ["f"]
        self.weight_init_max, self.weight_init_min = None, None
        self.pooling = "MEAN"


def test_torchrecs_config_and_the_package_reexports():
    import cpu_dist

    ebc = cpu_dist.EmbeddingBagCollection([TorchRecConfig()])  # type: ignore[list-item]
    (config,) = ebc.embedding_bag_configs()
    assert config == cpu_dist.EmbeddingBagConfig(10, 2, "tr", feature_names=["f"], pooling="mean")
    assert "tr" in repr(ebc) and list(ebc.parameters()) == []  # rows are not dense parameters


class TwoTower(torch.nn.Module):
    """A user's model: two collections, one nested, and a dense layer."""

    def __init__(self):
        super().__init__()
        self.user = EmbeddingBagCollection([EmbeddingBagConfig(0, 2, "u", feature_names=["a"])])
        self.item = torch.nn.Sequential(
            EmbeddingBagCollection([EmbeddingBagConfig(0, 2, "i", feature_names=["b"])])
        )
        self.dense = torch.nn.Linear(2, 1)

    def forward(self, kjt):
        return (self.dense(self.user(kjt).values()) * self.item(kjt).values()).sum()


def test_every_collection_of_a_model_is_found_and_stepped():
    model = TwoTower()
    assert [n for n, _ in collections_of(model)] == ["user", "item.0"]
    kjt = KeyedJaggedTensor.from_lengths_sync(["a", "b"], T([1, 2, 3]), T([1, 2]))
    before = {n: m.table_rows() for n, m in collections_of(model)}
    model(kjt).backward()
    assert sparse_step(model, lr=0.1) == {"user": {"u": 1}, "item.0": {"i": 2}}
    for n, m in collections_of(model):
        (table,) = m.table_rows()
        assert len(before[n][table][0]) == 0 and len(m.table_rows()[table][0]) > 0
        ids, rows = m.table_rows()[table]
        config = m.embedding_bag_configs()[0]
        assert not np.array_equal(rows, row_init(0, ids, 2, config.init_scale, table))
    assert {n for n, _ in model.named_parameters()} == {"dense.weight", "dense.bias"}


def test_state_dict_round_trips_the_local_rows_and_optimizer_state(tmp_path):
    trained = EmbeddingBagCollection(tables("adagrad"), seed=SEED)
    (trained(batch()).values() * _loss_weights(11)).sum().backward()
    trained.sparse_step()
    state = trained.state_dict()
    assert sorted(state) == sorted(
        f"embedding_bags.{t}.{k}"
        for t in ("items", "query")
        for k in ("ids", "weight", "optimizer_state")
    )
    torch.save(state, tmp_path / "m.pt")
    fresh = EmbeddingBagCollection(tables("adagrad"), seed=SEED)
    fresh.load_state_dict(torch.load(tmp_path / "m.pt"))
    for (n, (ids, rows)), (_, (ids2, rows2)) in zip(
        trained.table_rows().items(), fresh.table_rows().items()
    ):
        assert np.array_equal(ids, ids2) and np.array_equal(rows, rows2), n
    assert torch.equal(fresh(batch()).values(), trained(batch()).values())
    # another optimizer's state does not fit: refused naming the table, nothing half-loaded
    sgd = EmbeddingBagCollection(tables("sgd"), seed=SEED)
    fits = dict(state)  # query's state made to fit sgd's [n]: only items' is refused
    fits["embedding_bags.query.optimizer_state"] = torch.zeros(3)
    with pytest.raises(RuntimeError, match=r"table 'items': optimizer_state .* \(sgd\)"):
        sgd.load_state_dict(fits)
    assert all(len(ids) == 0 for ids, _ in sgd.table_rows().values())
    partial = {k: v for k, v in state.items() if not k.startswith("embedding_bags.query.")}
    with pytest.raises(RuntimeError, match=r"Missing key.*embedding_bags.query.ids"):
        sgd.load_state_dict(partial)
    assert all(len(ids) == 0 for ids, _ in sgd.table_rows().values())
    extra = {**state, "embedding_bags.other.ids": state["embedding_bags.items.ids"]}
    with pytest.raises(RuntimeError, match=r"Unexpected key.*embedding_bags.other.ids"):
        fresh.load_state_dict(extra)


def test_one_hot_features_keep_the_bits_of_todays_one_hot_embedding():
    """Today's one-hot embedding (``ShardedEmbedding``): one ``F.embedding`` of the table's
    unique rows over ``[B, F]``.  A collection of the same features gives the same forward and,
    after an SGD step, the same rows bit for bit (so the same gradients)."""
    names = [f"cat_{f}" for f in range(3)]
    config = EmbeddingBagConfig(0, 8, "embedding", feature_names=names, lr=0.5)
    ebc = EmbeddingBagCollection([config])
    g = torch.Generator().manual_seed(0)
    B = 64
    ids = torch.randint(0, 20, (B, 3), generator=g) + torch.arange(3) * 100  # fused-like keys
    kjt = KeyedJaggedTensor.from_lengths_sync(
        names, ids.t().reshape(-1), torch.ones(3 * B, dtype=torch.int64)
    )
    up = torch.randn(B, 3 * 8, generator=g)
    kt = ebc(kjt)
    (kt.values() * up).sum().backward()
    ebc.sparse_step()
    uniq, inverse = np.unique(ids.numpy().reshape(-1), return_inverse=True)
    leaf = torch.from_numpy(row_init(0, uniq, 8, config.init_scale, "embedding"))
    leaf.requires_grad_(True)
    today = torch.nn.functional.embedding(torch.from_numpy(inverse.reshape(B, 3)), leaf)
    assert torch.equal(kt.values(), today.reshape(B, 24))
    (today.reshape(B, 24) * up).sum().backward()
    rows = leaf.detach().numpy().copy()
    sparse_update("sgd", rows, None, leaf.grad.numpy(), 0.5)
    held_ids, held = ebc.table_rows()["embedding"]
    assert np.array_equal(held_ids, uniq) and np.array_equal(held, rows)
