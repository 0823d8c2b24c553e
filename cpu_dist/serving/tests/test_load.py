"""``cpu_dist.serving.load``: a bundle's model rebuilt from its record (built-in dlrm and dcnv2,
a user model from a file outside the package, one from a module on sys.path) scores exactly
what the trained module scored; a changed source is refused naming both hashes; a bundle of
the older DLRM-settings format still loads."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from cpu_dist.common.contracts import TABLE
from cpu_dist.common.features import CATEGORICAL_FEATURES
from cpu_dist.embeddings import EmbeddingBagConfig, KeyedJaggedTensor, sparse_step
from cpu_dist.models.factory import build_model
from cpu_dist.serving import load
from cpu_dist.serving.bundle import BundleError, BundleWriter, ModelSpec, TableInfo, open_bundle
from cpu_dist.serving.loader import bundle_job_tables
from cpu_dist.serving.model_record import ModelRecord, source_record
from cpu_dist.serving.tests.local_bundle import write_local

pytestmark = pytest.mark.timeout(120)
B = 16

USER_MODEL = '''
"""A user's model outside the package: a collection, a linear head."""
import torch
from torch import nn

from cpu_dist.embeddings import EmbeddingBagCollection


class Wide(nn.Module):
    def __init__(self, tables, dense_features, hidden):
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables)
        width = sum(t.embedding_dim * len(t.feature_names) for t in tables)
        self.head = nn.Sequential(nn.Linear(width + dense_features, hidden), nn.ReLU(),
                                  nn.Linear(hidden, 1))

    def forward(self, dense, sparse):
        x = torch.cat([self.ebc(sparse).values(), dense.to(torch.float32)], dim=1)
        return self.head(x).squeeze(-1)


def build(tables, dense_features, *, hidden=8):
    return Wide(tables, dense_features, hidden)
'''


def kjt(features: list[str], rng: np.random.Generator, multi: set[str] = frozenset()):
    """A batch of ``B`` samples: one id per feature, 0..3 ids for those in ``multi``."""
    lengths = np.concatenate(
        [rng.integers(0, 4, B) if f in multi else np.ones(B, np.int64) for f in features]
    )
    values = rng.integers(0, 60, int(lengths.sum()))
    return KeyedJaggedTensor(
        features, torch.from_numpy(values), lengths=torch.from_numpy(lengths.astype(np.int64))
    )


def train(model, features, rng, multi=frozenset(), steps=3):
    """A few SGD steps on the local rows and the dense layers, so both differ from init."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        dense = torch.from_numpy(rng.standard_normal((B, 13)).astype(np.float32))
        labels = torch.from_numpy(rng.integers(0, 2, B).astype(np.float32))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(dense, kjt(features, rng, multi)), labels
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        sparse_step(model)


def assert_scores_alike(model, loaded, features, rng, multi=frozenset()):
    """The loaded module scores what the trained one scores, bit for bit, ids it never saw
    (first-touch rows) included."""
    model.eval()
    with torch.no_grad():
        for _ in range(2):
            dense = torch.from_numpy(rng.standard_normal((B, 13)).astype(np.float32))
            batch = kjt(features, rng, multi)
            want, got = model(dense, batch), loaded(dense, batch)
            assert got.shape == (B,)
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_dlrm_bundle_round_trips(tmp_path):
    feats = ["cat_0", "cat_1", "cat_2"]
    tables = [EmbeddingBagConfig(0, 4, TABLE, feature_names=feats, seed=5, init_scale=0.3)]
    args = {"bot_mlp": [8, 4], "top_mlp": [8, 1]}
    model = build_model("dlrm", tables, 13, args, seed=5)
    rng = np.random.default_rng(0)
    train(model, feats, rng)
    record = ModelRecord("dlrm", args, 13, "float32", 5, True, tuple(feats))
    out = write_local(model, tables, record, tmp_path / "b")
    m = json.loads((out / "manifest.json").read_text())
    assert m["version"] == 5 and m["model"]["name"] == "dlrm" and m["model"]["args"] == args
    assert m["tables"][0]["features"] == feats and m["tables"][0]["seed"] == 5
    b = open_bundle(out)
    assert b.model == record and len(b.keys) > 10
    assert bundle_job_tables(b).fused
    loaded = load(out)
    assert not loaded.training and type(loaded).__name__ == "DLRM"
    assert_scores_alike(model, loaded, feats, rng)


def test_a_dcnv2_bundle_of_multi_hot_mixed_width_tables_round_trips(tmp_path):
    tables = [
        EmbeddingBagConfig(0, 4, "a", feature_names=["cat_0", "cat_1"], pooling="mean", seed=1),
        EmbeddingBagConfig(100, 8, "b", feature_names=["cat_2"], optimizer="adagrad", seed=1),
    ]
    args = {"bot_mlp": [8, 4], "top_mlp": [8, 1], "num_layers": 2, "low_rank_dim": 3}
    model = build_model("dcnv2", tables, 13, args, seed=1)
    rng = np.random.default_rng(1)
    feats, multi = ["cat_0", "cat_1", "cat_2"], {"cat_0"}
    train(model, feats, rng, multi)
    record = ModelRecord("dcnv2", args, 13, "float32", 1, False, tuple(feats))
    out = write_local(model, tables, record, tmp_path / "b")
    b = open_bundle(out)
    assert [t.info.record["pooling"] for t in b.tables.values()] == ["mean", "sum"]
    assert b.tables["b"].info.record["num_embeddings"] == 100
    jt = bundle_job_tables(b)
    assert not jt.fused and jt.names == ("a", "b") and jt.data_features == tuple(feats)
    loaded = load(out)
    assert type(loaded).__name__ == "DLRMDCNv2"
    assert_scores_alike(model, loaded, feats, rng, multi)


def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "src" / "wide_model.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(USER_MODEL))
    return path


def user_bundle(tmp_path: Path, spec: str):
    tables = [
        EmbeddingBagConfig(0, 4, "u", feature_names=["cat_0"], seed=2),
        EmbeddingBagConfig(0, 2, "v", feature_names=["cat_1", "cat_2"], seed=2),
    ]
    model = build_model(spec, tables, 13, {"hidden": 6}, seed=2)
    rng = np.random.default_rng(2)
    feats = ["cat_0", "cat_1", "cat_2"]
    train(model, feats, rng, {"cat_1"})
    record = ModelRecord(
        spec, {"hidden": 6}, 13, "float32", 2, False, tuple(feats), source_record(spec)
    )
    return model, write_local(model, tables, record, tmp_path / "bundle"), rng, feats


def test_a_user_model_from_a_file_travels_in_the_bundle(tmp_path):
    src = user_file(tmp_path)
    spec = f"{src}:build"
    model, out, rng, feats = user_bundle(tmp_path, spec)
    copy = out / "model" / "wide_model.py"
    assert copy.read_bytes() == src.read_bytes()
    m = json.loads((out / "manifest.json").read_text())
    source = m["model"]["source"]
    assert source["kind"] == "file" and source["path"] == "model/wide_model.py"
    assert source["sha256"] == m["model"]["source"]["sha256"] and len(source["sha256"]) == 64
    assert "model/wide_model.py" in m["files"]  # its crc32 is checked as every file's
    src.unlink()  # serving needs the bundle only
    loaded = load(out)
    assert type(loaded).__name__ == "Wide"
    assert_scores_alike(model, loaded, feats, rng, {"cat_1"})


def test_a_changed_source_is_refused_naming_both_hashes(tmp_path):
    src = user_file(tmp_path)
    _, out, _, _ = user_bundle(tmp_path, f"{src}:build")
    recorded = json.loads((out / "manifest.json").read_text())["model"]["source"]["sha256"]
    copy = out / "model" / "wide_model.py"
    copy.write_text(copy.read_text() + "\n# edited\n")
    import hashlib

    now = hashlib.sha256(copy.read_bytes()).hexdigest()
    with pytest.raises(BundleError, match="corrupt or truncated"):  # the crc32 first
        load(out)
    with pytest.raises(BundleError, match=f"sha256 {now}.*exported with sha256 {recorded}"):
        load(out, check=False)


def test_a_file_that_changes_before_the_export_is_refused(tmp_path):
    src = user_file(tmp_path)
    spec = f"{src}:build"
    record = ModelRecord(spec, {}, 13, source=source_record(spec))
    src.write_text(src.read_text() + "\n# edited during the job\n")
    writer = BundleWriter(tmp_path / "b", [TableInfo("u", 4, 0, {})])
    with pytest.raises(BundleError, match="the file changed during the job"):
        writer.finish(record, {}, 1)
    writer.abort()
    assert not (tmp_path / "b").exists()


def test_a_module_spec_records_its_module_and_checks_its_hash(tmp_path, monkeypatch):
    pkg = tmp_path / "mods" / "user_pkg_h4"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "wide.py").write_text(textwrap.dedent(USER_MODEL))
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    monkeypatch.delitem(sys.modules, "user_pkg_h4", raising=False)
    monkeypatch.delitem(sys.modules, "user_pkg_h4.wide", raising=False)
    spec = "user_pkg_h4.wide:build"
    model, out, rng, feats = user_bundle(tmp_path, spec)
    source = json.loads((out / "manifest.json").read_text())["model"]["source"]
    assert source["kind"] == "module" and source["path"] == "user_pkg_h4.wide"
    assert not (out / "model").exists()  # a module is installed, not copied
    assert_scores_alike(model, load(out), feats, rng, {"cat_1"})
    (pkg / "wide.py").write_text(textwrap.dedent(USER_MODEL) + "\n# v2\n")
    with pytest.raises(BundleError, match="the code changed since the export"):
        load(out)


def test_a_bundle_of_dlrm_settings_loads_as_the_builtin_dlrm(tmp_path):
    """``export_from_client``'s ModelSpec (the format before models were recorded): the
    default job's fused table, the built-in dlrm."""
    feats = list(CATEGORICAL_FEATURES)
    tables = [EmbeddingBagConfig(0, 4, TABLE, feature_names=feats, seed=0, init_scale=0.5)]
    model = build_model("dlrm", tables, 13, {"bot_mlp": [8, 4], "top_mlp": [8, 1]}, seed=0)
    rng = np.random.default_rng(3)
    train(model, feats, rng, steps=1)
    keys, rows = model.embedding.table_rows()[TABLE]
    dense = {k: v for k, v in model.state_dict().items() if "embedding_bags" not in k}
    spec = ModelSpec(4, 13, 26, (8, 4), (8, 1), "float32", 0, 0.5, TABLE)
    writer = BundleWriter(tmp_path / "b", [TableInfo(TABLE, 4, len(keys))])
    writer.add(TABLE, keys, rows)
    writer.finish(spec, dense, 1)
    b = open_bundle(tmp_path / "b")
    assert b.model.name == "dlrm" and b.model.fused and b.model.data_features == tuple(feats)
    assert b.tables[TABLE].info.record["seed"] == 0
    assert_scores_alike(model, load(tmp_path / "b"), feats, rng)
