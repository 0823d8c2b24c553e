"""Export for serving: a job's --export bundle scores, in a plain process without MPI or a PS,
exactly what the job's final evaluation scored; the bundle exported from the job's last
checkpoint is the same bundle; a damaged bundle is refused naming the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cpu_dist.serving.bundle import open_bundle

from .launch import SMALL, mpirun, run_module

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    bundle, ckpt, metrics = tmp / "bundle", tmp / "ckpt", tmp / "m.jsonl"
    proc = mpirun(
        4,
        [
            "--worker-num",
            "2",
            *SMALL,
            "--eval-batches",
            "3",
            "--export",
            str(bundle),
            "--metrics-out",
            str(metrics),
            "--checkpoint-dir",
            str(ckpt),
            "--checkpoint-every",
            "20",
        ],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    final = [x for x in lines if "eval_auc" in x][-1]
    return tmp, bundle, ckpt, final


def test_the_bundle_scores_what_the_job_scored(job):
    _, bundle, _, final = job
    proc = run_module("cpu_dist.serving", str(bundle), "--batch-size", "96", "--eval-batches", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["steps"] == 20  # steps done, as checkpoints count them
    assert got["eval_auc"] == pytest.approx(final["eval_auc"], abs=1e-4)
    assert got["eval_logloss"] == pytest.approx(final["eval_logloss"], abs=1e-4)


def test_the_bundle_applies_the_jobs_data_settings(job):
    _, bundle, _, final = job
    proc = run_module("cpu_dist.serving", str(bundle), "--eval-batches", "3")  # batch 96: its
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["eval_auc"] == pytest.approx(final["eval_auc"], abs=1e-4)
    proc = run_module("cpu_dist.serving", str(bundle), "--data", "criteo", "--data-path", "x")
    assert proc.returncode == 2 and "was trained on synthetic data" in proc.stderr


def test_the_checkpoint_exports_the_same_bundle(job):
    tmp, bundle, ckpt, _ = job
    again = tmp / "from-checkpoint"
    proc = run_module("cpu_dist.export", str(ckpt), "--output", str(again))
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = open_bundle(bundle), open_bundle(again)
    assert a.spec == b.spec and a.steps == b.steps == 20
    assert a.data == b.data and a.data is not None
    assert (a.data.kind, a.data.batch_size, a.data.max_ind_range) == ("synthetic", 96, None)
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.rows, b.rows)
    assert len(a.keys) > 100 and np.all(np.diff(a.keys) > 0)
    for name in a.dense:
        np.testing.assert_array_equal(a.dense[name].numpy(), b.dense[name].numpy())


def copy_bundle(bundle: Path, to: Path) -> Path:
    shutil.copytree(bundle, to)
    return to


def test_a_damaged_bundle_is_refused_naming_the_file(job, tmp_path):
    _, bundle, _, _ = job
    broken = copy_bundle(bundle, tmp_path / "broken")
    rows = broken / "tables" / "embedding" / "rows.npy"  # a folder per table
    data = bytearray(rows.read_bytes())
    data[-1] ^= 0xFF
    rows.write_bytes(bytes(data))
    proc = run_module("cpu_dist.serving", str(broken), "--batch-size", "96")
    assert proc.returncode == 2
    assert f"bundle {rows}: corrupt or truncated" in proc.stderr


def test_an_export_replaces_an_earlier_bundle_whole(job, tmp_path):
    _, bundle, ckpt, _ = job
    again = copy_bundle(bundle, tmp_path / "bundle")
    (again / "tables/embedding/rows.npy").write_bytes(b"stale")  # an earlier bundle, damaged
    proc = run_module("cpu_dist.export", str(ckpt), "--output", str(again))
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_array_equal(open_bundle(again).rows, open_bundle(bundle).rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no temporaries left
