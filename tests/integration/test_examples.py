"""The example job files of ``cpu_dist/examples/`` (the README's worked example, the DCN-v2
job and MLPerf's DLRM-DCNv2 on multi-hot Criteo) train as written: a short real job of each,
2 workers and 1 PS shard, scores its held-out batches and holds rows in every table the file
declares."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from cpu_dist.train.dump import table_rows
from cpu_dist.train.metrics import read_summary

from .launch import train

pytestmark = pytest.mark.timeout(600)

EXAMPLES = Path(__file__).resolve().parents[2] / "cpu_dist/examples"


SAMPLE = EXAMPLES.parent / "data/tests/data/criteo_sample.tsv"
# The MLPerf job reads Criteo: the sample stands in for the day files (a smaller batch, since
# the sample has 180 training and 20 held-out rows).
DATA = {"mlperf_dcnv2": ["--data", "criteo", "--data-path", str(SAMPLE), "--batch-size", "16"]}


@pytest.mark.parametrize("name", ["two_tower", "dcnv2", "mlperf_dcnv2"])
def test_an_example_job_file_trains_every_table(name, tmp_path):
    job_file = EXAMPLES / f"{name}.toml"
    declared = {t["name"] for t in tomllib.loads(job_file.read_text())["tables"]}
    metrics = tmp_path / "metrics.jsonl"
    flags = ["--config", str(job_file), "--max_step", "4", "--batch-size", "256"]
    flags += DATA.get(name, [])
    got = train(tmp_path, name, 2, 1, [*flags, "--metrics-out", str(metrics)])
    rows = table_rows(got)
    assert set(rows) == declared
    assert all(len(keys) for keys, _ in rows.values())
    summary = read_summary(metrics)
    assert summary["steps"] == 4 and np.isfinite(summary["eval_auc"])
