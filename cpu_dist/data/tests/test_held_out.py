"""'All of' a held-out split is every row of it, the last partial batch included, so what is
scored does not depend on the batch size; a count takes that many full batches."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_dist.data import make_dataset
from cpu_dist.data.generate import write_file
from cpu_dist.data.synthetic import HELD_OUT_BATCHES


@pytest.fixture(scope="module")
def tsv(tmp_path_factory):
    return str(write_file(tmp_path_factory.mktemp("held") / "train.txt", 1000))  # 100 eval rows


@pytest.mark.parametrize("batch", [96, 37, 100, 128])
def test_all_eval_batches_cover_every_row_once(tsv, batch):
    d = make_dataset("criteo", path=tsv)
    got = list(d.eval_batches(batch, None))
    assert sum(len(b) for b in got) == 100
    labels = np.concatenate([b.labels for b in got])
    whole = next(iter(d.eval_batches(100, None)))
    np.testing.assert_array_equal(labels, whole.labels)


def test_a_count_takes_full_batches_only(tsv):
    d = make_dataset("criteo", path=tsv)
    assert [len(b) for b in d.eval_batches(37, 5)] == [37, 37]


def test_the_endless_stream_scores_its_fixed_number_for_all():
    d = make_dataset("synthetic")
    assert len(list(d.eval_batches(16, None))) == HELD_OUT_BATCHES
