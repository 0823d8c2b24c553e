"""Criteo made multi-hot (``--multi-hot-sizes``): each id's bag is a pure function of (seed,
feature, id), the id first, the drawn ids uniform below the feature's hash size; worker
shares make the global batch; the flags are checked."""

import numpy as np
import pytest

from cpu_dist.common.data_checks import MLPERF_SIZES, parse_sizes
from cpu_dist.common.features import categorical_names
from cpu_dist.common.flags import parse_args
from cpu_dist.common.validate import ConfigError, validate
from cpu_dist.data import make_dataset
from cpu_dist.data.multi_hot import MultiHot

pytestmark = pytest.mark.timeout(60)

NAMES = categorical_names(26)
SAMPLE = "cpu_dist/data/tests/data/criteo_sample.tsv"


def test_an_ids_bag_depends_on_seed_feature_and_id_alone():
    mh = MultiHot(MLPERF_SIZES, (2**32,) * 26, NAMES, seed=7)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 2**32, (64, 26))
    first = mh.bag_values(20, ids[:, 20])
    assert first.shape == (64, 100) and (first[:, 0] == ids[:, 20]).all()
    shuffled = np.ascontiguousarray(ids[::-1, 20])  # other rows, other batch: the same bags
    np.testing.assert_array_equal(mh.bag_values(20, shuffled), first[::-1])
    other_seed = MultiHot(MLPERF_SIZES, (2**32,) * 26, NAMES, seed=8).bag_values(20, ids[:, 20])
    assert (other_seed[:, 1:] != first[:, 1:]).mean() > 0.99
    other_feature = mh.bag_values(21, ids[:, 20])  # size 27: not feature 20's draws
    assert (other_feature[:, 1:27] != first[:, 1:27]).mean() > 0.99
    bags = mh.bags(ids)
    assert sorted(bags) == sorted(n for n, s in zip(NAMES, MLPERF_SIZES) if s > 1)
    assert sum(len(b.values) for b in bags.values()) / 64 + MLPERF_SIZES.count(1) == 214


def test_drawn_ids_are_uniform_below_the_hash_size():
    mh = MultiHot((1,) * 25 + (200,), (2**32,) * 25 + (1000,), NAMES, seed=0)
    drawn = mh.bag_values(25, np.arange(500, dtype=np.int64))[:, 1:]
    assert drawn.min() >= 0 and drawn.max() < 1000
    counts = np.bincount(drawn.reshape(-1) // 100, minlength=10)  # 99,500 draws, 10 bins
    expected = drawn.size / 10
    assert ((counts - expected) ** 2 / expected).sum() < 30  # chi-square, 9 dof: p < 1e-3


def test_criteo_batches_are_multi_hot_and_shares_make_the_global_batch():
    sizes = (2,) * 13 + (1,) * 12 + (5,)
    data = make_dataset("criteo", path=SAMPLE, multi_hot_sizes=sizes, seed=3)
    _, batch = next(data.train_batches(24))
    assert sorted(batch.bags) == sorted([*NAMES[:13], NAMES[25]])
    assert (batch.bags["cat_25"].lengths == 5).all()
    ids = batch.keys & (2**32 - 1)
    np.testing.assert_array_equal(batch.bags["cat_0"].values[::2], ids[:, 0])
    parts = [data.worker_batch(0, 24, r, 3) for r in range(3)]
    joined = np.concatenate([p.bags["cat_25"].values for p in parts])
    np.testing.assert_array_equal(joined, batch.bags["cat_25"].values)
    again = make_dataset("criteo", path=SAMPLE, multi_hot_sizes=sizes, seed=3)
    np.testing.assert_array_equal(
        next(again.train_batches(24))[1].bags["cat_3"].values, batch.bags["cat_3"].values
    )


def test_sizes_are_parsed_and_checked():
    assert parse_sizes(",".join(map(str, MLPERF_SIZES)), 26) == MLPERF_SIZES
    cfg = validate(parse_args(["--data", "criteo", "--data-path", SAMPLE,
                               "--multi-hot-sizes", "mlperf"]), 3)  # fmt: skip
    assert cfg.data.multi_hot_sizes == MLPERF_SIZES
    for argv, words in [
        (["--multi-hot-sizes", "3,2"], "2 sizes given, the data has 26"),
        (["--multi-hot-sizes", "x"], "expected 26 integers"),
        (["--multi-hot-sizes", ",".join(["0"] * 26)], "feature 0's size 0"),
    ]:
        with pytest.raises(ConfigError, match=words):
            validate(parse_args(["--data", "criteo", "--data-path", SAMPLE, *argv]), 3)
    with pytest.raises(ConfigError, match=r"--multi-hot-sizes.*not --data synthetic"):
        validate(parse_args(["--multi-hot-sizes", "mlperf"]), 3)
