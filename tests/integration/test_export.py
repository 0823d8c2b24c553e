"""Export for serving: a job's --export bundle scores, in a plain process without MPI or a PS,
exactly what the job's final evaluation scored, from the CLI and from
``cpu_dist.serving.load`` (the default DLRM, a DLRM over three tables, dcnv2 over multi-hot
weighted features); the bundle exported from the job's last checkpoint is the same bundle; a
damaged bundle is refused naming the file."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from cpu_dist.common.config import DataConfig
from cpu_dist.common.metrics_log import read_records
from cpu_dist.data import dataset_for, eval_batches
from cpu_dist.data.features import BatchFeatures
from cpu_dist.models.scoring import evaluate
from cpu_dist.serving import load
from cpu_dist.serving.bundle import open_bundle
from cpu_dist.serving.loader import bundle_job_tables
from cpu_dist.testing.parquet_files import DATA as PARQUET_DATA
from cpu_dist.testing.parquet_files import TABLES as PARQUET_TABLES
from cpu_dist.testing.parquet_files import write_parquet
from cpu_dist.train.dump import table_rows

from .launch import ROOT, SMALL, mpirun, run_module

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
    final = [x for x in read_records(metrics) if "eval_auc" in x][-1]
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
    assert a.model == b.model and a.steps == b.steps == 20
    assert (a.model.name, a.model.fused) == ("dlrm", True)
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
    # the path is now a link to the one version it holds: the old directory and every
    # temporary are gone (common/bundle_link.py)
    assert again.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["bundle", again.readlink().name]
    )


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
    metrics = tmp / "m.jsonl"
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
            "--eval-batches",
            "3",
            "--metrics-out",
            str(metrics),
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
    return tmp, bundle, ckpt, table_rows(state), final_eval(metrics)


def final_eval(metrics: Path) -> dict:
    return [x for x in read_records(metrics) if "eval_auc" in x][-1]


def load_auc(bundle: Path, batches: int) -> float:
    """The eval AUC of ``cpu_dist.serving.load``'s module on the bundle's data, its batches
    made by ``BatchFeatures`` with the bundle's tables (what a user's own service does)."""
    b = open_bundle(bundle)
    model = load(bundle)
    assert b.data is not None and b.data.kind == "synthetic"
    data = DataConfig(zipf_exponent=b.data.zipf_exponent, bags=b.data.bags, weights=b.data.weights)
    dataset = dataset_for(data, b.model.seed)
    features = BatchFeatures(bundle_job_tables(b), dataset.kind, dataset.offsets)
    scores, labels = [], []
    with torch.no_grad():
        for batch in eval_batches(dataset, b.data.batch_size, batches):
            scores.append(model(torch.from_numpy(batch.dense), features(batch)).double().numpy())
            labels.append(batch.labels)
    return evaluate(np.concatenate(scores), np.concatenate(labels))["auc"]


def cli_eval(bundle: Path, *argv: str) -> dict:
    proc = run_module("cpu_dist.serving", str(bundle), *argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_bundle_scores_what_the_job_scored_from_load(job):
    _, bundle, _, final = job
    assert load_auc(bundle, 3) == pytest.approx(final["eval_auc"], abs=1e-4)


def test_a_job_of_several_tables_exports_every_tables_rows(tables_job):
    _, bundle, _, want, final = tables_job
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
    # the DLRM over the three tables scores what the job scored
    got = cli_eval(bundle, "--eval-batches", "3")
    assert got["eval_auc"] == pytest.approx(final["eval_auc"], abs=1e-4)
    assert load_auc(bundle, 3) == pytest.approx(final["eval_auc"], abs=1e-4)


def test_the_checkpoint_of_several_tables_exports_the_same_rows(tables_job):
    tmp, bundle, ckpt, _, _ = tables_job
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
    tmp, bundle, _, _, _ = tables_job
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
    assert a.model == b.model
    for name, t in a.tables.items():
        assert {k: t.info.record.get(k) for k in SPEC_FIELDS} == {
            k: b.tables[name].info.record.get(k) for k in SPEC_FIELDS
        }, name


# dcnv2 over tables of two widths, multi-hot (mean and sum, empty bags) and weighted features.
DCN_TOML = """
[model]
name = "dcnv2"
num_layers = 2
low_rank_dim = 8

[data]
bags = { cat_0 = [0, 3], cat_20 = [1, 4] }
weights = ["cat_1", "cat_20"]

[[tables]]
name = "low"
dim = 4
features = ["cat_0", "cat_1", "cat_2", "cat_3", "cat_4", "cat_5", "cat_6", "cat_7", "cat_8",
            "cat_9", "cat_10", "cat_11", "cat_12"]
pooling = "mean"

[[tables]]
name = "high"
dim = 8
features = ["cat_13", "cat_14", "cat_15", "cat_16", "cat_17", "cat_18", "cat_19", "cat_20",
            "cat_21", "cat_22", "cat_23", "cat_24", "cat_25"]
num_embeddings = 2000
optimizer = "rowwise_adagrad"
"""


def test_a_dcnv2_bundle_scores_what_the_job_scored(tmp_path):
    job = tmp_path / "dcn.toml"
    job.write_text(DCN_TOML)
    bundle, metrics = tmp_path / "bundle", tmp_path / "m.jsonl"
    proc = mpirun(
        4,
        [
            "--worker-num",
            "2",
            *SMALL,
            "--config",
            str(job),
            "--max_step",
            "8",
            "--eval-batches",
            "3",
            "--export",
            str(bundle),
            "--metrics-out",
            str(metrics),
        ],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = final_eval(metrics)
    b = open_bundle(bundle)
    assert b.model.name == "dcnv2" and b.model.args["low_rank_dim"] == 8
    assert b.data is not None and b.data.bags == (("cat_0", 0, 3), ("cat_20", 1, 4))
    assert [t.info.record["pooling"] for t in b.tables.values()] == ["mean", "sum"]
    scores = tmp_path / "scores.txt"
    got = cli_eval(bundle, "--eval-batches", "3", "--scores-out", str(scores))
    assert got["eval_auc"] == pytest.approx(final["eval_auc"], abs=1e-4)
    assert len(scores.read_text().splitlines()) == got["eval_samples"] == 3 * 96
    assert load_auc(bundle, 3) == pytest.approx(final["eval_auc"], abs=1e-4)


def test_a_checkpoint_of_a_user_model_refuses_an_export_once_its_source_changed(tmp_path):
    """The manifest records the user model's source hash: exported with that source, the
    checkpoint's bundle holds it; once the file changed, the export is refused naming both
    hashes, and a resume says the source changed."""
    model = tmp_path / "towers.py"
    shutil.copy(ROOT / "cpu_dist/examples/user_model.py", model)
    ckpt = tmp_path / "ck"
    argv = [
        "--worker-num",
        "2",
        *SMALL,
        "--config",
        str(ROOT / "cpu_dist/examples/two_tower.toml"),
        "--model",
        f"{model}:two_tower",
        "--max_step",
        "4",
        "--batch-size",
        "96",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "2",
    ]
    proc = mpirun(3, argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (step,) = sorted(ckpt.glob("step-*"))[-1:]
    trained = hashlib.sha256(model.read_bytes()).hexdigest()
    assert (
        json.loads((step / "manifest.json").read_text())["config"]["model.source_sha256"] == trained
    )
    ok = run_module("cpu_dist.export", str(step), "--output", str(tmp_path / "b1"))
    assert ok.returncode == 0, ok.stderr
    model.write_text(model.read_text() + "\n# changed\n")
    now = hashlib.sha256(model.read_bytes()).hexdigest()
    refused = run_module("cpu_dist.export", str(step), "--output", str(tmp_path / "b2"))
    assert refused.returncode != 0
    assert trained in refused.stderr and now in refused.stderr, refused.stderr
    assert not (tmp_path / "b2").exists()
    resumed = mpirun(3, [*argv, "--max_step", "6", "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{trained!r} -> {now!r}" in resumed.stderr, resumed.stderr[-3000:]


def test_a_parquet_bundle_of_weighted_bags_scores_the_jobs_auc_without_its_job_file(tmp_path):
    """Issue 48 item 4: the bundle records the data's path and every column the job read
    (label, dense, each feature's ids and weights), so serving needs no flag; was: eval AUC
    0.6478 for the job's 0.6507, the weights dropped, exit 0.  The job's checkpoint exports
    the same record (its dense width and features are the Parquet columns')."""
    data = write_parquet(tmp_path / "day.parquet", rows=1200)
    job = tmp_path / "job.toml"
    job.write_text(PARQUET_TABLES + PARQUET_DATA)
    bundle, metrics, ckpt = tmp_path / "bundle", tmp_path / "m.jsonl", tmp_path / "ckpt"
    proc = mpirun(
        3,
        [
            "--worker-num", "2", *SMALL, "--config", str(job), "--data-path", str(data),
            "--batch-size", "48", "--max_step", "10", "--eval-batches", "-1", "--export",
            str(bundle),
            "--metrics-out", str(metrics), "--checkpoint-dir", str(ckpt),
            "--checkpoint-every", "10",
        ],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = final_eval(metrics)
    got = cli_eval(bundle)  # no --config, no data flag
    assert got["eval_samples"] == 120
    assert got["eval_auc"] == pytest.approx(final["eval_auc"], abs=1e-6)
    assert got["eval_logloss"] == pytest.approx(final["eval_logloss"], abs=1e-6)
    d = open_bundle(bundle).data
    assert d is not None and d.weight_columns == (("tags", "tag_w"),) and d.path == str(data)
    again = tmp_path / "from-checkpoint"
    proc = run_module("cpu_dist.export", str(ckpt), "--output", str(again))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert open_bundle(again).data == d and open_bundle(again).model == open_bundle(bundle).model


def test_a_synthetic_bundle_of_features_of_its_own_names_scores_the_jobs_auc(tmp_path):
    """Issue 48 items 4 and 6 together: a synthetic job whose tables name features of their
    own (user, hist, tags beside cat_3) over a dense width of 5 and [data] cardinalities
    exports a bundle that records that stream, so serving without --config scores the job's
    final evaluation; was: served as cat_0 ... cat_25 and 13 dense features (exit 2, the bags'
    feature unknown).  Its checkpoint's export is the same (was: 13 dense features, cat_*)."""
    from .test_models_equivalence import OWN_NAMES_TOML

    job = tmp_path / "own.toml"
    job.write_text(OWN_NAMES_TOML)
    bundle, metrics, ckpt = tmp_path / "bundle", tmp_path / "m.jsonl", tmp_path / "ckpt"
    proc = mpirun(
        2,
        [
            "--worker-num", "1", *SMALL, "--config", str(job), "--batch-size", "24",
            "--max_step", "6", "--eval-batches", "3", "--export", str(bundle),
            "--metrics-out", str(metrics), "--checkpoint-dir", str(ckpt),
            "--checkpoint-every", "6",
        ],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = final_eval(metrics)
    got = cli_eval(bundle, "--eval-batches", "3")  # no --config
    assert got["eval_samples"] == final["eval_samples"] == 72
    assert got["eval_auc"] == pytest.approx(final["eval_auc"], abs=1e-6)
    assert got["eval_logloss"] == pytest.approx(final["eval_logloss"], abs=1e-6)
    b = open_bundle(bundle)
    assert b.data is not None and (b.data.num_dense, b.model.dense_features) == (5, 5)
    again = tmp_path / "from-checkpoint"
    proc = run_module("cpu_dist.export", str(ckpt), "--output", str(again))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert open_bundle(again).data == b.data and open_bundle(again).model == b.model
