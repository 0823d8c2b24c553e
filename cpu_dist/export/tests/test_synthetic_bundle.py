"""A synthetic job's bundle scores the stream it was trained on: the bundle records the
stream's features, dense width and cardinalities (``[data] dense``, ``[data] cardinalities``,
the tables' features of their own names), ``python -m cpu_dist.serving`` rebuilds exactly that
stream with no flag, and a job file that would draw another is refused in one line.  A bundle
written before these were recorded, whose features of other names were drawn over
cardinalities it does not say, needs the job's file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cpu_dist.common.config import Config
from cpu_dist.common.flags import parse_args
from cpu_dist.common.validate import validate
from cpu_dist.data import dataset_for, eval_batches
from cpu_dist.data.features import BatchFeatures
from cpu_dist.embeddings import configs_of
from cpu_dist.export.records import data_spec, settings_model_record
from cpu_dist.models.factory import build_model
from cpu_dist.models.scoring import evaluate
from cpu_dist.serving.__main__ import main
from cpu_dist.serving.tests.local_bundle import write_local

pytestmark = pytest.mark.timeout(120)
BATCH = 16
OWN = """
[[tables]]
name = "users"
dim = 4
features = ["user"]
num_embeddings = 5000

[[tables]]
name = "items"
dim = 4
features = ["hist", "tags", "cat_3"]

[data]
kind = "synthetic"
cardinalities = { tags = 300 }
bags = { hist = [0, 5] }
"""


def job(tmp_path, toml: str, name: str = "own.toml") -> tuple[str, Config]:
    path = tmp_path / name
    path.write_text(toml)
    argv = ["--config", str(path), "--batch-size", str(BATCH), "--arch-mlp-bot", "8-4"]
    return str(path), validate(parse_args(argv), 3)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """An untrained model of the job's tables, exported with the records a checkpoint's
    export writes (``data_spec``, ``settings_model_record`` of its settings)."""
    tmp = tmp_path_factory.mktemp("synthetic")
    path, cfg = job(tmp, OWN + "dense = 5\n")
    settings = cfg.settings()
    record = settings_model_record(settings, [])
    tables = configs_of(cfg.tables, seed=cfg.train.seed)
    model = build_model("dlrm", tables, 5, record.args, seed=cfg.train.seed).eval()
    out = write_local(model, tables, record, tmp / "bundle", data_spec(settings))
    dataset = dataset_for(cfg.data, cfg.train.seed)
    features = BatchFeatures(cfg.tables, dataset.kind, dataset.offsets)
    logits, labels = [], []
    with torch.no_grad():
        for batch in eval_batches(dataset, BATCH, 2):
            logits.append(model(torch.from_numpy(batch.dense), features(batch)).double().numpy())
            labels.append(batch.labels.astype(np.float64))
    return tmp, path, cfg, out, evaluate(np.concatenate(logits), np.concatenate(labels))


def run(capsys, *argv) -> tuple[int, dict | str]:
    code = main([str(a) for a in argv])
    got = capsys.readouterr()
    return code, json.loads(got.out.strip().splitlines()[-1]) if code == 0 else got.err


def test_the_bundle_records_the_streams_features_dense_width_and_cardinalities(bundle):
    _, _, cfg, out, _ = bundle
    d = json.loads((out / "manifest.json").read_text())["data"]
    assert d["features"] == list(cfg.data.features) == ["cat_3", "user", "hist", "tags"]
    assert d["num_dense"] == 5  # was: not recorded, served as 13
    assert d["cardinalities"] == [["hist", 100000], ["tags", 300], ["user", 5000]]
    m = json.loads((out / "manifest.json").read_text())["model"]
    assert m["dense_features"] == 5 and m["data_features"] == d["features"]  # was: 13, cat_*
    older = data_spec({"data.kind": "synthetic", "train.batch_size": 8})
    assert (older.num_dense, older.cardinalities, older.features) == (13, (), ())
    parquet = data_spec({"data.kind": "parquet", "train.batch_size": 8, "data.num_dense": 13})
    assert (parquet.num_dense, parquet.cardinalities) == (None, None)


def test_serving_rebuilds_the_stream_and_refuses_a_job_file_that_draws_another(
    bundle, capsys, tmp_path
):
    _, path, _, out, want = bundle
    code, got = run(capsys, out, "--eval-batches", 2)  # no --config
    assert code == 0, got
    assert (got["eval_auc"], got["eval_logloss"]) == (want["auc"], want["logloss"])
    code, got = run(capsys, out, "--eval-batches", 2, "--config", path)  # the job's own file
    assert code == 0 and got["eval_auc"] == want["auc"]
    other, _ = job(tmp_path, OWN + "dense = 7\n", "seven.toml")
    code, err = run(capsys, out, "--config", other)
    assert code == 2 and err.count("\n") == 1
    assert "its job read the data with dense width 5; " in err and "dense says 7" in err
    other, _ = job(tmp_path, OWN.replace("tags = 300", "tags = 30") + "dense = 5\n", "c.toml")
    code, err = run(capsys, out, "--config", other)
    assert code == 2 and "cardinalities {'hist': 100000, 'tags': 300, 'user': 5000}" in err


def test_an_older_bundle_of_features_of_other_names_needs_the_job_file(bundle, capsys):
    tmp, path, _, out, want = bundle
    older = tmp / "older"
    older.mkdir()
    for f in out.rglob("*"):  # a plain copy: the link's version
        if f.is_file():
            (older / f.relative_to(out)).parent.mkdir(parents=True, exist_ok=True)
            (older / f.relative_to(out)).write_bytes(f.read_bytes())
    m = json.loads((older / "manifest.json").read_text())
    del m["data"]["num_dense"], m["data"]["cardinalities"]  # as the first version 5 wrote it
    (older / "manifest.json").write_text(json.dumps(m))
    code, err = run(capsys, older, "--eval-batches", 2)
    assert code == 2 and err.count("\n") == 1
    assert "its synthetic features user, hist, tags were drawn over cardinalities" in err
    code, got = run(capsys, older, "--eval-batches", 2, "--config", path)
    assert code == 0 and (got["eval_auc"], got["eval_logloss"]) == (want["auc"], want["logloss"])
