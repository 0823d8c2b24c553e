"""A Parquet bundle scores as it was trained (issue 48 item 4): a version 5 bundle records the
data's path and every column its job read, so ``python -m cpu_dist.serving BUNDLE`` with no
flag scores the weighted bags the job trained on; a bundle of version 4 (which kept the
weighted features but not their columns) is refused unless ``--config`` gives them; a job
file's ``[data] path`` is honoured, its columns must agree with the bundle's; ``--split``
picks the test, train or every row in file order (refused for the synthetic stream)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

from cpu_dist.common.config import DataConfig
from cpu_dist.common.parquet_schema import ParquetColumns
from cpu_dist.common.tables import JobTables, TableConfig, flag_table
from cpu_dist.data import dataset_for
from cpu_dist.data.features import BatchFeatures
from cpu_dist.embeddings import configs_of
from cpu_dist.export.records import data_spec
from cpu_dist.models.factory import build_model
from cpu_dist.models.scoring import evaluate
from cpu_dist.serving.__main__ import main
from cpu_dist.serving.bundle import DataSpec
from cpu_dist.serving.model_record import ModelRecord
from cpu_dist.serving.tests.local_bundle import train_locally, write_local
from cpu_dist.testing.parquet_files import write_parquet

pytestmark = pytest.mark.timeout(120)
BATCH = 40
ARGS = {"bot_mlp": [8, 4], "top_mlp": [8, 1]}
JT = JobTables(
    (
        TableConfig("users", 8, ("user",), optimizer="rowwise_adagrad"),
        TableConfig("items", 4, ("items", "tags"), num_embeddings=1000, pooling="mean"),
    ),
    data_features=("user", "items", "tags"),
)
WEIGHTS = (("tags", "tag_w"),)
DENSE = ("x0", "x1", "x2")
JOB_DATA = '[data]\nkind = "parquet"\ndense = ["x0", "x1", "x2"]\nweights = { tags = "tag_w" }\n'


def parquet_data(path, weights=WEIGHTS) -> DataConfig:
    """The DataConfig a job's validation makes of the test file's columns (the job file's
    ``[data]``: dense x0..x2, tags weighted by tag_w)."""
    return DataConfig(
        kind="parquet",
        path=str(path),
        weights=tuple(f for f, _ in weights),
        features=JT.data_features,
        weight_columns=weights,
        dense=DENSE,
    )


def scores_of(model, dataset, split: str, batch: int = BATCH):
    """The logits and labels of ``model`` on every row of ``split`` (as the job scores)."""
    features = BatchFeatures(JT, dataset.kind, None)
    logits, labels = [], []
    with torch.no_grad():
        for b in dataset.split_batches(split, batch):
            logits.append(model(torch.from_numpy(b.dense), features(b)).double().numpy())
            labels.append(b.labels.astype(np.float64))
    return np.concatenate(logits), np.concatenate(labels)


@pytest.fixture(scope="module")
def parquet_bundle(tmp_path_factory):
    """A DLRM trained on a Parquet file's weighted bags, exported with the record a job's
    export writes (``records.data_spec`` of its settings)."""
    tmp = tmp_path_factory.mktemp("pq")
    path = write_parquet(tmp / "day.parquet")
    data = parquet_data(path)
    tables = configs_of(JT, seed=3)
    model = build_model("dlrm", tables, len(DENSE), ARGS, seed=3)
    dataset = dataset_for(data, 3)
    features = BatchFeatures(JT, dataset.kind, None)
    batches = (batch for _, (_, batch) in zip(range(6), dataset.train_batches(BATCH)))
    train_locally(model, features, batches, 0.1)
    settings = {f"data.{k}": v for k, v in dataclasses.asdict(data).items()}
    spec = data_spec({**settings, "train.batch_size": BATCH})
    record = ModelRecord("dlrm", ARGS, len(DENSE), "float32", 3, False, JT.data_features)
    out = write_local(model, tables, record, tmp / "bundle", spec)
    return tmp, out, model, dataset


def run(capsys, argv) -> tuple[int, dict | str]:
    code = main([str(a) for a in argv])
    got = capsys.readouterr()
    return code, json.loads(got.out.strip().splitlines()[-1]) if code == 0 else got.err


def as_version_4(bundle, to):
    """A copy of ``bundle`` as version 4 wrote it: no path, no columns (``weights`` kept)."""
    shutil.copytree(bundle, to)
    m = json.loads((to / "manifest.json").read_text())
    keep = {f.name for f in dataclasses.fields(DataSpec)[:7]}
    m["data"] = {k: v for k, v in m["data"].items() if k in keep}
    m["version"] = 4
    (to / "manifest.json").write_text(json.dumps(m))
    return to


def test_a_parquet_bundle_scores_its_weighted_bags_without_a_job_file(parquet_bundle, capsys):
    tmp, out, model, dataset = parquet_bundle
    d = json.loads((out / "manifest.json").read_text())["data"]
    assert d["path"] == str((tmp / "day.parquet").resolve()) and d["recorded"]
    assert d["weight_columns"] == [["tags", "tag_w"]] and d["dense"] == list(DENSE)
    want = evaluate(*scores_of(model, dataset, "eval"))
    code, got = run(capsys, [out])
    assert code == 0, got
    assert got["eval_auc"] == want["auc"] and got["eval_logloss"] == want["logloss"]
    assert got["eval_samples"] == 60 and got["split"] == "eval"  # every 10th row of 600
    # the weights are in effect: the same rows unweighted score otherwise
    unweighted = dataset_for(parquet_data(tmp / "day.parquet", weights=()), 3)
    assert evaluate(*scores_of(model, unweighted, "eval"))["logloss"] != want["logloss"]


def test_an_older_parquet_bundle_needs_the_job_file(parquet_bundle, capsys, tmp_path):
    tmp, out, model, dataset = parquet_bundle
    old = as_version_4(out, tmp_path / "v4")
    code, err = run(capsys, [old])  # was: exit 0, the weights dropped
    assert code == 2 and err.count("\n") == 1
    assert "version 4 does not record the columns its job read (weights of tags)" in err
    code, err = run(capsys, [old, "--data-path", tmp / "day.parquet"])  # was: a conversion
    assert code == 2 and "does not record the columns" in err
    job = tmp_path / "job.toml"
    job.write_text(JOB_DATA + f'path = "{tmp / "day.parquet"}"\n')
    code, got = run(capsys, [old, "--config", job])
    assert code == 0, got
    assert got["eval_auc"] == evaluate(*scores_of(model, dataset, "eval"))["auc"]


def test_the_job_files_path_is_honoured_and_its_columns_must_agree(parquet_bundle, capsys):
    tmp, out, model, _ = parquet_bundle
    other = write_parquet(tmp / "other.parquet", seed=5)
    job = tmp / "other.toml"
    job.write_text(f'[data]\npath = "{other}"\n')  # the columns: the bundle's
    code, got = run(capsys, [out, "--config", job])
    assert code == 0, got
    want = evaluate(*scores_of(model, dataset_for(parquet_data(other), 3), "eval"))
    assert got["eval_auc"] == want["auc"]
    job.write_text(f'[data]\npath = "{other}"\nweights = {{ tags = "x0" }}\n')
    code, err = run(capsys, [out, "--config", job])
    assert code == 2 and "weight columns {'tags': 'tag_w'}" in err and "'x0'" in err


def test_split_picks_the_rows_to_score(parquet_bundle, capsys, tmp_path):
    _, out, model, dataset = parquet_bundle
    scores = tmp_path / "p.txt"
    code, got = run(capsys, [out, "--split", "all", "--scores-out", scores])
    assert code == 0 and got["eval_samples"] == 600 and got["split"] == "all"
    logits, _ = scores_of(model, dataset, "all", batch=600)  # every row, in file order
    p = np.array([float(x) for x in scores.read_text().split()])
    np.testing.assert_allclose(p, 1 / (1 + np.exp(-logits)), rtol=1e-6)
    code, got = run(capsys, [out, "--split", "train"])
    assert code == 0 and got["eval_samples"] == 540
    code, err = run(capsys, [out, "--split", "test"])  # one file: no test split
    assert code == 2 and "no rows in its test split" in err


def test_split_all_is_refused_for_the_synthetic_stream(tmp_path, capsys):
    jt = flag_table(dim=4, optimizer="sgd", lr=0.5, init_scale=0.5, admit_after=0, expire_after=0)
    tables = configs_of(jt, seed=1)
    model = build_model("dlrm", tables, 13, ARGS, seed=1).eval()
    record = ModelRecord("dlrm", ARGS, 13, "float32", 1, True, jt.data_features)
    data = DataSpec("synthetic", None, None, DataConfig.zipf_exponent, 16, recorded=True)
    out = write_local(model, tables, record, tmp_path / "b", data)
    code, err = run(capsys, [out, "--split", "all"])
    assert code == 2 and "--split all: the synthetic stream never ends" in err
    code, got = run(capsys, [out, "--split", "train", "--eval-batches", "2"])
    assert code == 0 and got["eval_samples"] == 32


def test_columns_travel_in_the_data_record():
    cols = ParquetColumns(("a", "b"), ("x",), "y", {"b": "bw"})
    assert cols.weights == {"b": "bw"}
    d = data_spec(
        {"data.kind": "parquet", "train.batch_size": 8, "data.path": "/no/such/file",
         "data.features": ["a", "b"], "data.weight_columns": [["b", "bw"]], "data.label": "y",
         "data.dense": ["x"], "data.weights": ["b"]}
    )  # fmt: skip
    assert (d.features, d.weight_columns, d.label, d.dense) == (
        ("a", "b"),
        (("b", "bw"),),
        "y",
        ("x",),
    )
    assert d.recorded and d.path is None  # a path that names nothing is not recorded
