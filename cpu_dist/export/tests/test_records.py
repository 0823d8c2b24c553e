"""What an export records of a model: from a checkpoint's settings (a checkpoint from before
``--model`` is the built-in dlrm; dcnv2's cross-network flags and a job file's ``[model]``
keys become the factory's arguments), a user model's source with its hash, the data's bags
and weights; a checkpoint's model that cannot be rebuilt is refused before anything is
written."""

from __future__ import annotations

import hashlib

import pytest
import torch

from cpu_dist.embeddings import EmbeddingBagConfig
from cpu_dist.export import check_model
from cpu_dist.export.records import SOURCE_SHA256_KEY, data_spec, settings_model_record
from cpu_dist.models.factory import build_model
from cpu_dist.serving.bundle import BundleError
from cpu_dist.serving.model_record import source_record, table_record
from cpu_dist.serving.rows import BundleRows

TABLES = [
    {"name": "a", "dim": 4, "seed": 9, "init_scale": 0.5, "features": ["cat_0", "cat_1"]},
    {"name": "b", "dim": 4, "seed": 9, "init_scale": 0.5, "features": ["cat_2"]},
]


def test_a_checkpoint_from_before_model_names_is_the_builtin_dlrm():
    settings = {"model.bot_mlp": [8, 4], "model.top_mlp": [4, 1], "train.seed": 2}
    r = settings_model_record(settings, TABLES[:1])
    assert (r.name, r.args, r.dtype, r.seed) == (
        "dlrm",
        {"bot_mlp": [8, 4], "top_mlp": [4, 1]},
        "float32",
        2,
    )
    assert r.fused and r.source is None and r.dense_features == 13  # one table, no tables.fused
    assert r.data_features[0] == "cat_0" and len(r.data_features) == 26


def test_dcnv2_settings_and_job_file_arguments_become_its_arguments():
    settings = {
        "model.name": "dcnv2",
        "model.bot_mlp": [8, 4],
        "model.top_mlp": [4, 1],
        "model.dcn_num_layers": 2,
        "model.dcn_low_rank_dim": 16,
        "model.args": [["low_rank_dim", 8], ["widths", [4, [2, 1]]]],  # a job file's, JSON
        "model.dtype": "float64",
        "train.seed": 9,
        "tables.fused": False,
    }
    r = settings_model_record(settings, TABLES)
    assert r.args == {
        "bot_mlp": [8, 4],
        "top_mlp": [4, 1],
        "num_layers": 2,
        "low_rank_dim": 8,  # [model] beats the flag
        "widths": [4, [2, 1]],
    }
    assert (r.dtype, r.seed, r.fused) == ("float64", 9, False)


def test_a_file_spec_records_its_file_and_hash(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def build(tables, dense_features):\n    raise NotImplementedError\n")
    s = source_record(f"{src}:build")
    assert s is not None and (s.kind, s.path, s.origin) == ("file", "model/m.py", str(src))
    assert s.sha256 == hashlib.sha256(src.read_bytes()).hexdigest()
    assert source_record("dlrm") is None


def test_a_checkpoint_trained_with_other_code_is_refused(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def build(tables, dense_features):\n    raise NotImplementedError\n")
    now = hashlib.sha256(src.read_bytes()).hexdigest()
    settings = {"model.name": f"{src}:build", "train.seed": 0}
    r = settings_model_record({**settings, SOURCE_SHA256_KEY: now}, TABLES)
    assert r.source is not None and r.source.sha256 == now
    with pytest.raises(BundleError, match=f"sha256 {now} now, .*trained with sha256 abc"):
        settings_model_record({**settings, SOURCE_SHA256_KEY: "abc"}, TABLES)


def test_the_data_record_keeps_bags_and_weights():
    d = data_spec(
        {
            "data.kind": "synthetic",
            "train.batch_size": 64,
            "data.bags": [["cat_0", 0, 3], ["cat_4", 1, 2]],
            "data.weights": ["cat_4"],
        }
    )
    assert d.bags == (("cat_0", 0, 3), ("cat_4", 1, 2)) and d.weights == ("cat_4",)
    assert data_spec({"data.kind": "synthetic", "train.batch_size": 8}).bags == ()


def dense_of(name: str, args: dict) -> dict[str, torch.Tensor]:
    tables = [
        EmbeddingBagConfig(0, 4, t["name"], feature_names=t["features"], seed=9, init_scale=0.5)
        for t in TABLES
    ]
    model = build_model(name, tables, 13, args, seed=0)
    model.embedding.set_row_source(BundleRows({}))
    return model.state_dict()


def test_a_checkpoint_whose_model_cannot_be_rebuilt_is_refused(tmp_path):
    settings = {"model.bot_mlp": [8, 4], "model.top_mlp": [4, 1], "train.seed": 9}
    record = settings_model_record({**settings, "tables.fused": False}, TABLES)
    tables = [
        table_record(EmbeddingBagConfig(0, 4, t["name"], feature_names=t["features"]), 9)
        for t in TABLES
    ]
    check_model(record, tables, dense_of("dlrm", {"bot_mlp": [8, 4], "top_mlp": [4, 1]}))
    other = dense_of("dlrm", {"bot_mlp": [8, 4], "top_mlp": [6, 1]})
    with pytest.raises(BundleError, match="dense state does not fit its model 'dlrm'"):
        check_model(record, tables, other)
    src = tmp_path / "m.py"
    src.write_text("def build(tables, dense_features):\n    raise NotImplementedError('v2')\n")
    broken = settings_model_record({**settings, "model.name": f"{src}:build"}, TABLES)
    with pytest.raises(BundleError, match=r"cannot be rebuilt: .*NotImplementedError: v2"):
        check_model(broken, tables, other)
    src.unlink()
    with pytest.raises(BundleError, match="cannot record its source"):
        settings_model_record({**settings, "model.name": f"{src}:build"}, TABLES)
