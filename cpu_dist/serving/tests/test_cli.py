"""``python -m cpu_dist.serving BUNDLE``: scores any model's bundle on the bundle's data (the
synthetic eval stream, multi-hot bags and weights included) through ``BatchFeatures`` with the
bundle's tables, exactly as the trained module scores it; ``--scores-out`` writes one
probability per scored row, in order, ``%.9g`` one a line, no header."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cpu_dist.common.config import DataConfig
from cpu_dist.common.features import categorical_names
from cpu_dist.common.tables import JobTables, TableConfig, flag_table
from cpu_dist.data import dataset_for, eval_batches
from cpu_dist.data.features import BatchFeatures
from cpu_dist.embeddings import configs_of
from cpu_dist.models.factory import build_model
from cpu_dist.models.scoring import evaluate
from cpu_dist.serving.__main__ import main, probabilities, write_scores
from cpu_dist.serving.bundle import DataSpec
from cpu_dist.serving.model_record import ModelRecord
from cpu_dist.serving.tests.local_bundle import train_locally, write_local

pytestmark = pytest.mark.timeout(120)
BATCH = 32


def trained(name, jt: JobTables, args, data: DataConfig, seed: int, steps: int = 4):
    """A model trained locally on the synthetic stream's first batches, and its features."""
    tables = configs_of(jt, seed=seed)
    model = build_model(name, tables, 13, args, seed=seed)
    dataset = dataset_for(data, seed)
    features = BatchFeatures(jt, dataset.kind, dataset.offsets)
    train_locally(
        model, features, (dataset.global_batch(step, BATCH) for step in range(steps)), 0.05
    )
    return model, tables, dataset, features


def local_scores(model, dataset, features, batches: int):
    logits, labels = [], []
    with torch.no_grad():
        for batch in eval_batches(dataset, BATCH, batches):
            logits.append(model(torch.from_numpy(batch.dense), features(batch)).double().numpy())
            labels.append(batch.labels.astype(np.float64))
    return np.concatenate(logits), np.concatenate(labels)


def run_cli(capsys, argv):
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_the_default_dlrm_bundle_scores_every_row_in_order(tmp_path, capsys):
    jt = flag_table(dim=4, optimizer="sgd", lr=0.5, init_scale=0.5, admit_after=0, expire_after=0)
    args = {"bot_mlp": [8, 4], "top_mlp": [8, 1]}
    model, tables, dataset, features = trained("dlrm", jt, args, DataConfig(), seed=4)
    record = ModelRecord("dlrm", args, 13, "float32", 4, True, jt.data_features)
    data = DataSpec("synthetic", None, None, DataConfig.zipf_exponent, BATCH)
    out = write_local(model, tables, record, tmp_path / "bundle", data)
    scores = tmp_path / "scores.txt"
    got = run_cli(capsys, [str(out), "--eval-batches", "3", "--scores-out", str(scores)])
    logits, labels = local_scores(model, dataset, features, 3)
    want = evaluate(logits, labels)
    assert got["eval_samples"] == 3 * BATCH and got["steps"] == 3
    assert got["eval_auc"] == want["auc"] and got["eval_logloss"] == want["logloss"]
    lines = scores.read_text().split("\n")
    assert lines[-1] == "" and len(lines) == 3 * BATCH + 1  # one a line, newline-terminated
    p = probabilities(logits)
    np.testing.assert_allclose(p, 1.0 / (1.0 + np.exp(-logits)), rtol=1e-12)
    assert lines[:-1] == [f"{x:.9g}" for x in p]


def test_a_dcnv2_bundle_of_multi_hot_weighted_features_scores_as_trained(tmp_path, capsys):
    names = categorical_names()
    jt = JobTables(
        (
            TableConfig("small", 4, names[:13], pooling="mean"),
            TableConfig("big", 8, names[13:], num_embeddings=1000, optimizer="adagrad"),
        )
    )
    bags, weights = (("cat_0", 0, 3), ("cat_20", 1, 4)), ("cat_1", "cat_20")
    data = DataConfig(bags=bags, weights=weights)
    args = {"bot_mlp": [8, 4], "top_mlp": [8, 1], "num_layers": 2, "low_rank_dim": 3}
    model, tables, dataset, features = trained("dcnv2", jt, args, data, seed=6)
    batch = next(iter(eval_batches(dataset, BATCH, 1)))
    assert set(batch.bags) == {"cat_0", "cat_1", "cat_20"}  # the data has bags to serve
    record = ModelRecord("dcnv2", args, 13, "float32", 6, False, jt.data_features)
    spec = DataSpec("synthetic", None, None, DataConfig.zipf_exponent, BATCH, bags, weights)
    out = write_local(model, tables, record, tmp_path / "bundle", spec)
    scores = tmp_path / "s.txt"
    got = run_cli(capsys, [str(out), "--eval-batches", "2", "--scores-out", str(scores)])
    logits, labels = local_scores(model, dataset, features, 2)
    assert got["eval_auc"] == evaluate(logits, labels)["auc"]
    p = np.array([float(x) for x in scores.read_text().split()])
    np.testing.assert_allclose(p, 1.0 / (1.0 + np.exp(-logits)), rtol=1e-8)
    # a bundle that lacks the bags: a job file's [data] gives them (--config)
    bare = DataSpec("synthetic", None, None, DataConfig.zipf_exponent, BATCH)
    out = write_local(model, tables, record, tmp_path / "bare", bare)
    job = tmp_path / "job.toml"
    job.write_text(
        '[data]\nkind = "synthetic"\nbags = { cat_0 = [0, 3], cat_20 = [1, 4] }\n'
        'weights = ["cat_1", "cat_20"]\n'
    )
    with_bags = run_cli(capsys, [str(out), "--eval-batches", "2", "--config", str(job)])
    assert with_bags == got
    one_hot = run_cli(capsys, [str(out), "--eval-batches", "2"])  # other ids: other scores
    assert one_hot["eval_logloss"] != got["eval_logloss"]


def test_the_scores_file_format(tmp_path):
    """Probabilities (not logits), 9 significant digits, no header, one a line."""
    path = tmp_path / "p.txt"
    write_scores(path, np.array([0.0, 2.5, -20.0, -800.0, 800.0, -1e-12]))
    assert path.read_text() == "0.5\n0.92414182\n2.06115362e-09\n0\n1\n0.5\n"
