"""The synthetic Criteo-like stream: determinism, shapes, key ranges, Zipf law, speed."""

import math
import time

import numpy as np
import pytest

from cpu_dist.data import SyntheticCriteo
from cpu_dist.data.synthetic import DEFAULT_CARDINALITIES, _zipf_cdf, _zipf_guide, _zipf_ranks

pytestmark = pytest.mark.timeout(60)


def test_batches_are_a_pure_function_of_seed_split_step_and_size():
    a, b = SyntheticCriteo(seed=3), SyntheticCriteo(seed=3)
    x, y = a.global_batch(7, 256), b.global_batch(7, 256)
    for f in ("dense", "keys", "labels"):
        np.testing.assert_array_equal(getattr(x, f), getattr(y, f))
    # Random access: asking for other steps first changes nothing.
    a.global_batch(0, 256)
    np.testing.assert_array_equal(a.global_batch(7, 256).keys, x.keys)
    assert not np.array_equal(a.global_batch(8, 256).keys, x.keys)
    assert not np.array_equal(a.global_batch(7, 256, "eval").keys, x.keys)
    assert not np.array_equal(SyntheticCriteo(seed=4).global_batch(7, 256).keys, x.keys)


def test_shapes_dtypes_and_value_ranges():
    d = SyntheticCriteo()
    b = d.global_batch(0, 512)
    assert b.dense.shape == (512, 13) and b.dense.dtype == np.float32
    assert b.keys.shape == (512, 26) and b.keys.dtype == np.int64
    assert b.labels.shape == (512,) and b.labels.dtype == np.float32
    assert np.all(b.dense >= 0) and np.all(np.isfinite(b.dense))  # log1p of counts
    assert set(np.unique(b.labels)) <= {0.0, 1.0}
    lo = d.offsets
    hi = d.offsets + np.array(d.cardinalities)
    assert np.all((b.keys >= lo) & (b.keys < hi)), (
        "each column stays inside its feature's key range"
    )
    assert d.cardinalities == list(DEFAULT_CARDINALITIES)
    assert 0.1 < d.global_batch(1, 4096).labels.mean() < 0.5


def test_custom_cardinalities_and_validation():
    d = SyntheticCriteo(cardinalities=[1, 2, 10], num_dense=2, num_sparse=3)
    b = d.global_batch(0, 300)
    assert b.dense.shape == (300, 2) and b.keys.shape == (300, 3)
    np.testing.assert_array_equal(b.keys[:, 0], 0)
    assert set(np.unique(b.keys[:, 1])) <= {1, 2}
    with pytest.raises(ValueError):
        SyntheticCriteo(cardinalities=[10, 10], num_sparse=3)
    with pytest.raises(ValueError):
        SyntheticCriteo(zipf_exponent=0)
    with pytest.raises(ValueError):
        d.global_batch(0, 8, split="valid")


def test_ids_follow_bounded_zipf_with_hot_ids_permuted():
    card, s = 1000, 1.05
    d = SyntheticCriteo(cardinalities=[card], num_sparse=1, zipf_exponent=s, seed=1)
    ids = np.concatenate([d.global_batch(i, 4096).keys[:, 0] for i in range(10)])
    counts = np.bincount(ids, minlength=card)
    order = np.argsort(-counts)
    p = np.arange(1, card + 1, dtype=np.float64) ** -s
    p /= p.sum()
    n = ids.size
    # The three hottest ids carry the Zipf law's top probabilities (within 5 sigma).
    for rank in range(3):
        sigma = math.sqrt(n * p[rank] * (1 - p[rank]))
        assert abs(counts[order[rank]] - n * p[rank]) < 5 * sigma
    # The hot ids are spread by the permutation, not 0, 1, 2.
    assert set(order[:3].tolist()) != {0, 1, 2}
    # The rank -> id map is a bijection: every id is reachable.
    a, c = int(d._perm_a[0]), int(d._perm_c[0])
    assert len({(a * r + c) % card for r in range(card)}) == card


def test_zipf_cdf_is_exact():
    cdf = _zipf_cdf(5, 1.0)
    w = 1.0 / np.arange(1, 6)
    np.testing.assert_allclose(cdf, np.cumsum(w) / w.sum())
    assert cdf[-1] == 1.0


@pytest.mark.parametrize("card", [1, 2, 3, 24, 1460, 12517, 200_000, 1_000_000])
def test_guided_zipf_ranks_are_searchsorteds(card):
    s = 1.05
    cdf = _zipf_cdf(card, s)
    k = _zipf_guide(card, s)[0].shape[0] - 1
    edges = np.arange(k + 1, dtype=np.float64) / k
    u = np.concatenate(
        [
            np.random.default_rng(card).random(50_000),
            cdf[:-1],  # the CDF's own values and their neighbours: where a rank changes
            np.nextafter(cdf[:-1], 0.0),
            np.nextafter(cdf[:-1], 1.0),
            edges[:-1],  # the guide's bucket edges and the floats just below them
            np.nextafter(edges[1:], 0.0),
            [0.0, np.nextafter(1.0, 0.0)],
        ]
    )
    u = u[(u >= 0.0) & (u < 1.0)]
    want = np.minimum(np.searchsorted(cdf, u, side="right"), card - 1)
    np.testing.assert_array_equal(_zipf_ranks(card, s, u), want)


def test_labels_follow_the_hidden_model():
    d = SyntheticCriteo(seed=2)
    b = d.global_batch(0, 20000)
    hidden = d.hidden_scalar(b.keys).sum(axis=1)
    # Samples with a high hidden sparse score click more often.
    hi = b.labels[hidden > np.quantile(hidden, 0.8)].mean()
    lo = b.labels[hidden < np.quantile(hidden, 0.2)].mean()
    assert hi > lo + 0.15


def test_batch_of_2048_is_fast():
    d = SyntheticCriteo()
    d.global_batch(0, 2048)  # builds the Zipf tables once
    times = []
    for step in range(1, 12):
        t0 = time.perf_counter()
        d.global_batch(step, 2048)
        times.append(time.perf_counter() - t0)
    # ~4 ms on an idle 2-core VM; generous for a loaded machine.
    assert sorted(times)[len(times) // 2] < 0.02


def test_train_and_eval_iterators():
    d = SyntheticCriteo(seed=5)
    it = d.train_batches(64, start_step=3)
    step, batch = next(it)
    assert step == 3
    np.testing.assert_array_equal(batch.keys, d.global_batch(3, 64).keys)
    assert next(it)[0] == 4
    ev = list(d.eval_batches(64, 2))
    assert len(ev) == 2
    np.testing.assert_array_equal(ev[1].keys, d.global_batch(1, 64, "eval").keys)
