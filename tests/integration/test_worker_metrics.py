"""The summary's per-worker figures are reduced over all workers under new keys (``_sum``,
``_max``, ``_mean``), while the old keys keep worker 0's (real mpirun job, real PS ranks)."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_dist.data import make_dataset
from cpu_dist.train.metrics import read_summary

from .launch import SMALL, mpirun

pytestmark = pytest.mark.timeout(300)


def test_rows_pushed_are_summed_over_the_workers(tmp_path):
    metrics = tmp_path / "m.jsonl"
    argv = ["--worker-num", "2", *SMALL, "--aggregation", "ps", "--metrics-out", str(metrics)]
    proc = mpirun(3, argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = read_summary(metrics)
    # with ps aggregation each worker hands over the gradients of its share's unique keys
    data = make_dataset("synthetic")
    pushed = [
        sum(len(np.unique(data.worker_batch(t, 96, r, 2).keys)) for t in range(20))
        for r in range(2)
    ]
    assert s["rows_pushed"] == pushed[0]  # the old key: worker 0's, as before
    assert s["rows_pushed_sum"] == sum(pushed)
    assert s["bytes_pushed_sum"] > s["bytes_pushed"]
    assert s["t_forward"] > 0 and s["t_forward_mean"] > 0
    assert s["exposed_sparse_s_max"] >= s["exposed_sparse_s"]
    assert s["staleness_max_max"] == 0 and s["staleness_mean_mean"] == 0
