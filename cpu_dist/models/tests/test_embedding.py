"""ShardedEmbedding against nn.EmbeddingBag(mode="sum") holding the same rows."""

import numpy as np
import pytest
import torch
from torch import nn

from cpu_dist.common.contracts import row_init
from cpu_dist.models import ShardedEmbedding

pytestmark = pytest.mark.timeout(30)

DIM = 4


class DictStore:
    """A numpy dict of rows, first-touch initialised like the PS; records every pull."""

    def __init__(self, dim: int, seed: int = 7, scale: float = 0.5) -> None:
        self.dim, self.seed, self.scale = dim, seed, scale
        self.rows: dict[int, np.ndarray] = {}
        self.pulls: list[np.ndarray] = []

    def pull(self, keys: np.ndarray) -> np.ndarray:
        assert keys.dtype == np.int64 and keys.ndim == 1
        self.pulls.append(keys.copy())
        new = [k for k in keys.tolist() if k not in self.rows]
        if new:
            for k, r in zip(
                new, row_init(self.seed, np.array(new, np.int64), self.dim, self.scale)
            ):
                self.rows[k] = r
        return np.stack([self.rows[k] for k in keys.tolist()]).astype(np.float32)


def _keys() -> torch.Tensor:
    # Repeated keys inside and across samples, large int64 values, unsorted.
    return torch.tensor([[5, 1 << 40, 5], [7, 5, 3], [3, 3, 1 << 40], [9, 7, 5]], dtype=torch.int64)


def test_forward_looks_up_rows_and_pulls_unique_sorted_keys_once():
    store = DictStore(DIM)
    emb = ShardedEmbedding(store, DIM)
    keys = _keys()
    out = emb(keys)
    assert out.shape == (4, 3, DIM) and out.dtype == torch.float32
    assert len(store.pulls) == 1
    np.testing.assert_array_equal(store.pulls[0], np.unique(keys.numpy()))
    np.testing.assert_array_equal(emb.unique_keys(keys), store.pulls[0])
    for b in range(4):
        for f in range(3):
            np.testing.assert_array_equal(out[b, f].detach().numpy(), store.rows[int(keys[b, f])])


def test_gradients_equal_embedding_bag_sum():
    store = DictStore(DIM)
    emb = ShardedEmbedding(store, DIM)
    keys = _keys()
    upstream = torch.randn(4, 3, DIM, generator=torch.Generator().manual_seed(0))

    out = emb(keys)
    (out * upstream).sum().backward()
    gkeys, grads = emb.sparse_grads()

    uniq = np.unique(keys.numpy())
    bag = nn.EmbeddingBag(len(uniq), DIM, mode="sum", _weight=torch.from_numpy(store.pull(uniq)))
    idx = torch.from_numpy(np.searchsorted(uniq, keys.numpy().reshape(-1)))
    ref_out = bag(idx.reshape(-1, 1)).reshape(4, 3, DIM)
    (ref_out * upstream).sum().backward()

    np.testing.assert_array_equal(out.detach().numpy(), ref_out.detach().numpy())
    np.testing.assert_array_equal(gkeys, uniq)
    assert grads.dtype == np.float32 and grads.shape == (len(uniq), DIM)
    np.testing.assert_allclose(grads, bag.weight.grad.numpy(), rtol=1e-6, atol=1e-6)
    # A key used 4 times gets the sum of its 4 upstream gradients.
    k5 = int(np.searchsorted(uniq, 5))
    want = upstream[0, 0] + upstream[0, 2] + upstream[1, 1] + upstream[3, 2]
    np.testing.assert_allclose(grads[k5], want.numpy(), rtol=1e-6)


def test_prepulled_rows_are_used_instead_of_pulling():
    store = DictStore(DIM)
    emb = ShardedEmbedding(store, DIM)
    keys = _keys()
    uniq = emb.unique_keys(keys)
    rows = np.arange(len(uniq) * DIM, dtype=np.float32).reshape(len(uniq), DIM)
    out = emb(keys, rows=torch.from_numpy(rows))
    assert store.pulls == []
    np.testing.assert_array_equal(out[1, 1].detach().numpy(), rows[np.searchsorted(uniq, 5)])
    out.sum().backward()
    _, grads = emb.sparse_grads()
    np.testing.assert_array_equal(grads[:, 0], [np.sum(keys.numpy() == k) for k in uniq])
    with pytest.raises(ValueError, match="shape"):
        emb(keys, rows=rows[:-1])


def test_float64_compute_gives_float32_gradients():
    store = DictStore(DIM)
    emb = ShardedEmbedding(store, DIM, dtype=torch.float64)
    out = emb(_keys())
    assert out.dtype == torch.float64
    (out**2).sum().backward()
    keys, grads = emb.sparse_grads()
    assert grads.dtype == np.float32
    np.testing.assert_allclose(
        grads[0], 2 * store.rows[int(keys[0])] * np.sum(_keys().numpy() == keys[0]), rtol=1e-6
    )


def test_errors_are_clear():
    emb = ShardedEmbedding(DictStore(DIM), DIM)
    with pytest.raises(RuntimeError, match="before any forward"):
        emb.sparse_grads()
    emb(_keys())
    with pytest.raises(RuntimeError, match="backward"):
        emb.sparse_grads()
    with pytest.raises(TypeError, match="int64"):
        emb(_keys().to(torch.int32))
    assert list(emb.parameters()) == []


def test_unique_keys_plan_is_reused_only_for_the_same_unmodified_tensor():
    emb = ShardedEmbedding(DictStore(DIM), DIM)
    keys = torch.tensor([[5, 3], [3, 9]])
    assert emb.unique_keys(keys).tolist() == [3, 5, 9]
    calls = []
    plain = emb._unique
    emb._unique = lambda k, inv: calls.append(1) or plain(k, inv)
    emb(keys)
    assert calls == []  # the forward used the plan made by unique_keys()
    emb(torch.tensor([[5, 3], [3, 9]]))
    assert calls == [1]  # another tensor, even with equal values: sorted again
    keys[0, 0] = 7  # modified in place: the plan no longer applies
    emb(keys)
    assert calls == [1, 1]
    assert emb._keys.tolist() == [3, 7, 9]


def test_a_plan_made_ahead_in_numpy_gives_the_forward_of_unique_keys():
    keys = _keys()
    a, b = ShardedEmbedding(DictStore(DIM), DIM), ShardedEmbedding(DictStore(DIM), DIM)
    uniq, inverse = ShardedEmbedding.plan_keys(keys.numpy())
    assert np.array_equal(b.use_plan(keys, (uniq, inverse)), a.unique_keys(keys))
    calls = []
    plain = b._unique
    b._unique = lambda k, inv: calls.append(1) or plain(k, inv)
    assert torch.equal(b(keys), a(keys)) and calls == []  # the plan, not a second sort
    with pytest.raises(TypeError, match="int64"):
        ShardedEmbedding.plan_keys(keys.numpy().astype(np.int32))
