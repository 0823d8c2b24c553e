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
from cpu_dist.train.dump import table_rows

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


# A job of tables of three widths and optimizers, one of them serving two features.
TABLES_TOML = """
[[tables]]
name = "narrow"
dim = 4
features = ["cat_0", "cat_1", "cat_2", "cat_3", "cat_4", "cat_5", "cat_6", "cat_7", "cat_8"]
optimizer = "sgd"
lr = 0.2

[[tables]]
name = "mid"
dim = 16
features = ["cat_9", "cat_10", "cat_11", "cat_12", "cat_13", "cat_14", "cat_15", "cat_16"]
optimizer = "rowwise_adagrad"
num_embeddings = 500

[[tables]]
name = "wide"
dim = 8
features = ["cat_17", "cat_18", "cat_19", "cat_20", "cat_21", "cat_22", "cat_23", "cat_24",
            "cat_25"]
optimizer = "adagrad"
init_scale = 0.05
"""
SPEC_FIELDS = ("dim", "optimizer", "init_scale", "seed", "num_embeddings", "eps", "features")


@pytest.fixture(scope="module")
def tables_job(tmp_path_factory):
    """A 3-table job (2 workers, 2 shards) with --export, --dump-state and a checkpoint at
    its last step, all of the same final state."""
    tmp = tmp_path_factory.mktemp("export-tables")
    job = tmp / "job.toml"
    job.write_text(TABLES_TOML)
    bundle, ckpt, dump = tmp / "bundle", tmp / "ckpt", tmp / "state.npz"
    proc = mpirun(
        4,
        [
            "--worker-num",
            "2",
            *SMALL,
            "--config",
            str(job),
            "--max_step",
            "6",
            "--export",
            str(bundle),
            "--dump-state",
            str(dump),
            "--checkpoint-dir",
            str(ckpt),
            "--checkpoint-every",
            "6",
        ],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(dump) as z:
        state = {k: z[k] for k in z.files}
    return tmp, bundle, ckpt, table_rows(state)


def test_a_job_of_several_tables_exports_every_tables_rows(tables_job):
    _, bundle, _, want = tables_job
    b = open_bundle(bundle)
    assert list(b.tables) == ["narrow", "mid", "wide"]  # the job's order
    assert b.steps == 6
    for name, (keys, values) in want.items():
        t = b.tables[name]
        assert len(keys) > 10, name
        np.testing.assert_array_equal(t.keys, keys, err_msg=name)
        np.testing.assert_array_equal(t.rows, values, err_msg=name)
        assert t.info.dim == values.shape[1] and t.info.rows == len(keys)
    assert b.tables["mid"].keys.max() < 500  # num_embeddings folded the ids
    # serving scores the default job's one table only: a clear refusal naming the tables
    proc = run_module("cpu_dist.serving", str(bundle), "--eval-batches", "1")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "holds tables 'narrow', 'mid', 'wide'" in proc.stderr, proc.stderr[-3000:]


def test_the_checkpoint_of_several_tables_exports_the_same_rows(tables_job):
    tmp, bundle, ckpt, _ = tables_job
    again = tmp / "from-checkpoint"
    proc = run_module("cpu_dist.export", str(ckpt), "--output", str(again))
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = open_bundle(bundle), open_bundle(again)
    assert (a.data, a.steps) == (b.data, b.steps)
    assert list(a.tables) == list(b.tables)
    for name, t in a.tables.items():
        np.testing.assert_array_equal(t.keys, b.tables[name].keys, err_msg=name)
        np.testing.assert_array_equal(t.rows, b.tables[name].rows, err_msg=name)
    for name in a.dense:
        np.testing.assert_array_equal(a.dense[name].numpy(), b.dense[name].numpy())


def test_a_job_and_its_checkpoint_export_the_same_table_specs(tables_job):
    tmp, bundle, _, _ = tables_job
    a = open_bundle(bundle)
    rec = {n: t.info.record for n, t in a.tables.items()}
    # each table's record names what makes its rows: its spec and the features it serves
    assert rec["mid"].get("optimizer") == "rowwise_adagrad", rec["mid"]
    assert rec["mid"].get("num_embeddings") == 500, rec["mid"]
    assert rec["wide"].get("init_scale") == 0.05, rec["wide"]
    assert rec["narrow"].get("features") == [f"cat_{i}" for i in range(9)], rec["narrow"]
    again = tmp / "from-checkpoint-specs"
    proc = run_module("cpu_dist.export", str(tmp / "ckpt"), "--output", str(again))
    assert proc.returncode == 0, proc.stderr[-3000:]
    b = open_bundle(again)
    assert a.spec == b.spec
    for name, t in a.tables.items():
        assert {k: t.info.record.get(k) for k in SPEC_FIELDS} == {
            k: b.tables[name].info.record.get(k) for k in SPEC_FIELDS
        }, name
