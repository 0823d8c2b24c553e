"""make_dataset and the uniform train/eval iterators over both kinds."""

from pathlib import Path

import numpy as np
import pytest

from cpu_dist.data import CriteoTSV, SyntheticCriteo, eval_batches, make_dataset, train_batches

pytestmark = pytest.mark.timeout(30)

SAMPLE = Path(__file__).parent / "data" / "criteo_sample.tsv"


def test_make_dataset_kinds():
    syn = make_dataset("synthetic", seed=4, zipf_exponent=1.2, cardinalities=[10] * 26)
    assert isinstance(syn, SyntheticCriteo) and syn.seed == 4 and syn.zipf_exponent == 1.2
    cri = make_dataset("criteo", path=SAMPLE, hash_size=2**20, eval_every=5)
    assert isinstance(cri, CriteoTSV) and cri.hash_size == 2**20 and cri.eval_every == 5
    assert syn.num_dense == cri.num_dense == 13 and syn.num_sparse == cri.num_sparse == 26
    with pytest.raises(ValueError, match="path"):
        make_dataset("criteo")
    with pytest.raises(ValueError, match="unknown"):
        make_dataset("imagenet")


@pytest.mark.parametrize("kind", ["synthetic", "criteo"])
def test_start_step_resumes_the_same_stream(kind):
    ds = make_dataset(kind, path=SAMPLE, seed=1)
    full = []
    for step, b in train_batches(ds, 16):
        full.append((step, b))
        if step == 5:
            break
    resumed = train_batches(ds, 16, start_step=3)
    for want_step, want in full[3:]:
        step, got = next(resumed)
        assert step == want_step
        np.testing.assert_array_equal(got.keys, want.keys)
        np.testing.assert_array_equal(got.labels, want.labels)


def test_criteo_iterators_end_with_the_file():
    ds = make_dataset("criteo", path=SAMPLE, eval_every=10)
    assert [s for s, _ in train_batches(ds, 50)] == [0, 1, 2]  # 180 train lines
    assert len(list(eval_batches(ds, 10, 5))) == 2  # 20 eval lines
    assert len(list(eval_batches(ds, 10, 1))) == 1


def test_eval_batches_are_repeatable():
    ds = make_dataset("synthetic", seed=9)
    a = list(eval_batches(ds, 32, 3))
    b = list(eval_batches(ds, 32, 3))
    assert len(a) == 3
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.keys, y.keys)


def test_features_are_named_as_torchrec_names_criteo_s_for_every_kind():
    from cpu_dist.common.features import CATEGORICAL_FEATURES, DENSE_FEATURES
    from cpu_dist.data.factory import feature_names, make_dataset

    assert feature_names(make_dataset("synthetic")) == (DENSE_FEATURES, CATEGORICAL_FEATURES)
    assert CATEGORICAL_FEATURES[25] == "cat_25" and DENSE_FEATURES[12] == "int_12"
    small = make_dataset("synthetic", cardinalities=[3, 4], num_dense=1, num_sparse=2)
    assert feature_names(small) == (("int_0",), ("cat_0", "cat_1"))
