"""Multi-hot and weighted synthetic features: bag shapes and laws, independence from the
one-hot stream, the hidden model's bag term, shares of a global batch, validation, speed."""

import time

import numpy as np
import pytest

from cpu_dist.common.config import DataConfig
from cpu_dist.data import SyntheticCriteo, dataset_for, make_dataset

pytestmark = pytest.mark.timeout(60)

BAGS = {"cat_1": (0, 6), "cat_4": (2, 2), "cat_9": (1, 20)}
WEIGHTS = ("cat_9", "cat_12")


def _data(**kw) -> SyntheticCriteo:
    return SyntheticCriteo(seed=kw.pop("seed", 3), bags=kw.pop("bags", BAGS), **kw)


def test_bags_have_their_lengths_ids_and_weights():
    d = _data(weights=WEIGHTS)
    b = d.global_batch(0, 4096)
    assert sorted(b.bags) == ["cat_1", "cat_12", "cat_4", "cat_9"]
    for name, (lo, hi) in BAGS.items():
        f = d.sparse_names.index(name)
        bag = b.bags[name]
        assert bag.lengths.dtype == np.int64 and bag.values.dtype == np.int64
        assert bag.lengths.min() == lo and bag.lengths.max() == hi  # both ends reached
        assert bag.values.shape == (int(bag.lengths.sum()),)
        assert np.all((bag.values >= 0) & (bag.values < d.cardinalities[f])), "own ids"
        assert (bag.weights is not None) == (name in WEIGHTS)
    assert np.any(b.bags["cat_1"].lengths == 0), "MIN 0 gives empty bags"
    w = b.bags["cat_9"].weights
    assert w.dtype == np.float32 and w.min() >= 0.5 and w.max() < 1.5
    assert w.std() > 0.25  # uniform on [0.5, 1.5): std 0.29, not a constant
    # A weighted one-hot feature is a bag of one holding its one-hot id.
    f12 = d.sparse_names.index("cat_12")
    one = b.bags["cat_12"]
    np.testing.assert_array_equal(one.lengths, 1)
    np.testing.assert_array_equal(one.values, b.keys[:, f12] - d.offsets[f12])
    assert one.weights is not None and one.weights.shape == (4096,)
    # Every key column stays in its feature's range, bagged or not (documented as ignored).
    assert np.all((b.keys >= d.offsets) & (b.keys < d.offsets + np.array(d.cardinalities)))


def test_all_empty_bags():
    b = _data(bags={"cat_0": (0, 0)}, weights=["cat_0"]).global_batch(1, 64)
    bag = b.bags["cat_0"]
    np.testing.assert_array_equal(bag.lengths, 0)
    assert bag.values.shape == (0,) and bag.weights is not None and bag.weights.shape == (0,)


def test_bags_are_a_pure_function_of_seed_split_step_and_size():
    x = _data(weights=WEIGHTS).global_batch(5, 512)
    y = _data(weights=WEIGHTS).global_batch(5, 512)
    for name in x.bags:
        np.testing.assert_array_equal(x.bags[name].lengths, y.bags[name].lengths)
        np.testing.assert_array_equal(x.bags[name].values, y.bags[name].values)
    np.testing.assert_array_equal(x.labels, y.labels)
    d = _data()
    d.global_batch(0, 512)  # random access: other steps first change nothing
    np.testing.assert_array_equal(
        d.global_batch(5, 512).bags["cat_9"].values, x.bags["cat_9"].values
    )
    for other in (
        d.global_batch(6, 512),
        d.global_batch(5, 512, "eval"),
        _data(seed=4).global_batch(5, 512),
    ):
        assert not np.array_equal(other.bags["cat_9"].lengths, x.bags["cat_9"].lengths)


def test_bags_leave_the_one_hot_stream_and_each_other_alone():
    plain = SyntheticCriteo(seed=3)
    bagged = _data(weights=WEIGHTS)
    p, b = plain.global_batch(2, 1024), bagged.global_batch(2, 1024)
    assert dict(p.bags) == {}
    np.testing.assert_array_equal(p.dense, b.dense)
    np.testing.assert_array_equal(p.keys, b.keys)
    assert not np.array_equal(p.labels, b.labels), "the bags' hidden terms change the labels"
    # A feature's bags do not depend on which other features are bagged or weighted.
    alone = SyntheticCriteo(seed=3, bags={"cat_9": BAGS["cat_9"]}).global_batch(2, 1024)
    np.testing.assert_array_equal(alone.bags["cat_9"].lengths, b.bags["cat_9"].lengths)
    np.testing.assert_array_equal(alone.bags["cat_9"].values, b.bags["cat_9"].values)
    assert alone.bags["cat_9"].weights is None


def test_bag_ids_follow_the_features_one_hot_law():
    card = 1000
    d = SyntheticCriteo(cardinalities=[card, 50], num_sparse=2, seed=1, bags={"cat_0": (1, 9)})
    one_hot, bag_ids = [], []
    for step in range(8):
        b = d.global_batch(step, 4096)
        one_hot.append(b.keys[:, 0] - d.offsets[0])
        bag_ids.append(b.bags["cat_0"].values)
    hot = np.argsort(-np.bincount(np.concatenate(one_hot), minlength=card))[:3]
    counts = np.bincount(np.concatenate(bag_ids), minlength=card)
    np.testing.assert_array_equal(np.argsort(-counts)[:3], hot)  # same permutation, same law
    p = counts / counts.sum()
    w = np.arange(1, card + 1, dtype=np.float64) ** -1.05
    np.testing.assert_allclose(np.sort(p)[::-1][:3], (w / w.sum())[:3], rtol=0.05)


def test_labels_follow_the_mean_of_the_weighted_hidden_scalars():
    # One feature, no dense signal, a steep gain: the label is nearly the sign of its term.
    d = SyntheticCriteo(
        cardinalities=[40],
        num_sparse=1,
        num_dense=1,
        seed=7,
        dense_signal=0.0,
        sparse_signal=60.0,
        bias=0.0,
        bags={"cat_0": (0, 4)},
        weights=["cat_0"],
    )
    b = d.global_batch(0, 4000)
    bag = b.bags["cat_0"]
    term = np.zeros(len(b))
    o = bag.offsets
    for i in range(len(b)):  # the definition, one sample at a time
        n = bag.lengths[i]
        if n:
            h = d.hidden_scalar(bag.values[o[i] : o[i + 1]] + d.offsets[0])
            term[i] = float(np.sum(h * bag.weights[o[i] : o[i + 1]])) / n
    np.testing.assert_allclose(d.bag_signal(0, bag), term, rtol=1e-12, atol=1e-15)
    sure = np.abs(term) > 0.1
    assert sure.sum() > 2000
    agree = (b.labels[sure] == 1.0) == (term[sure] > 0)
    assert agree.mean() > 0.99
    empty = bag.lengths == 0
    assert empty.sum() > 500 and 0.4 < b.labels[empty].mean() < 0.6  # term 0: p = 1/2


@pytest.mark.parametrize("world", [1, 2, 3])
def test_worker_shares_are_the_global_batchs_rows_with_their_bags(world):
    d = _data(weights=WEIGHTS)
    g = d.global_batch(4, 48)
    shares = [d.worker_batch(4, 48, r, world) for r in range(world)]
    for r, s in enumerate(shares):
        assert len(s) == 48 // world
        np.testing.assert_array_equal(s.keys, g.keys[r * 48 // world : (r + 1) * 48 // world])
    for name, bag in g.bags.items():
        np.testing.assert_array_equal(
            np.concatenate([s.bags[name].lengths for s in shares]), bag.lengths
        )
        np.testing.assert_array_equal(
            np.concatenate([s.bags[name].values for s in shares]), bag.values
        )
        if bag.weights is not None:
            np.testing.assert_array_equal(
                np.concatenate([s.bags[name].weights for s in shares]), bag.weights
            )
    np.testing.assert_array_equal(np.concatenate([s.labels for s in shares]), g.labels)


def test_eval_and_test_batches_have_bags():
    d = _data()
    ev = next(iter(d.eval_batches(64, 1)))
    te = next(iter(d.test_batches(64, 1)))
    np.testing.assert_array_equal(
        ev.bags["cat_9"].values, d.global_batch(0, 64, "eval").bags["cat_9"].values
    )
    assert not np.array_equal(ev.bags["cat_9"].lengths, te.bags["cat_9"].lengths)


@pytest.mark.parametrize(
    "bags,weights,match",
    [
        ({"cat_26": (1, 2)}, (), r"'cat_26'.*cat_0, cat_1, .*cat_25"),
        ({"user": (1, 2)}, (), r"bags names feature 'user'"),
        ({}, ("int_0",), r"weights names feature 'int_0'.*cat_0"),
        ({"cat_0": (3, 2)}, (), r"cat_0.*0 <= MIN <= MAX"),
        ({"cat_0": (-1, 2)}, (), r"cat_0.*0 <= MIN <= MAX"),
        ({"cat_0": (1.0, 2)}, (), r"cat_0.*two ints"),
        ({"cat_0": (1, 2, 3)}, (), r"cat_0.*two ints"),
        ({}, "cat_0", r"list of feature names"),
    ],
)
def test_bad_bags_and_weights_are_refused_by_name(bags, weights, match):
    with pytest.raises(ValueError, match=match):
        SyntheticCriteo(bags=bags, weights=weights)


def test_dataset_for_passes_the_jobs_bags_and_weights():
    cfg = DataConfig(bags=(("cat_1", 0, 6), ("cat_9", 1, 20)), weights=("cat_12",))
    d = dataset_for(cfg, seed=3)
    assert d.bags == {"cat_1": (0, 6), "cat_9": (1, 20)} and d.weights == ("cat_12",)
    want = SyntheticCriteo(seed=3, bags={"cat_1": (0, 6), "cat_9": (1, 20)}, weights=["cat_12"])
    got, ref = d.global_batch(1, 256), want.global_batch(1, 256)
    assert sorted(got.bags) == sorted(ref.bags) == ["cat_1", "cat_12", "cat_9"]
    np.testing.assert_array_equal(got.bags["cat_9"].values, ref.bags["cat_9"].values)
    np.testing.assert_array_equal(got.labels, ref.labels)
    assert dict(dataset_for(DataConfig(), seed=3).global_batch(1, 256).bags) == {}
    with pytest.raises(ValueError, match=r"'cat_30'.*cat_0"):
        dataset_for(DataConfig(bags=(("cat_30", 1, 2),)), seed=3)


def test_file_data_refuses_bags_and_weights():
    with pytest.raises(ValueError, match=r"cat_3.*kind 'synthetic' alone.*multi_hot_sizes"):
        make_dataset("criteo", path="unused.tsv", bags={"cat_3": (1, 2)})
    with pytest.raises(ValueError, match=r"cat_5.*kind 'criteo-bin'"):
        make_dataset("criteo-bin", path="unused", weights=("cat_5",))


def test_a_multi_hot_batch_of_4096_is_fast():
    bags = {f"cat_{f}": (1, 20) for f in range(5)}  # cat_2 and cat_3: 1e6 and 2e5 ids
    d = SyntheticCriteo(bags=bags, weights=["cat_0"])
    d.global_batch(0, 4096)
    times = []
    for step in range(1, 12):
        t0 = time.perf_counter()
        d.global_batch(step, 4096)
        times.append(time.perf_counter() - t0)
    median = sorted(times)[len(times) // 2]
    # ~10 ms of CPU (the one-hot part ~4 ms), ~20 ms wall on a loaded 2-core VM; generous.
    assert median < 0.08, f"median {median * 1e3:.1f} ms"
