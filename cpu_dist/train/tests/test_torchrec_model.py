"""A user model that builds its collections from TorchRec ``EmbeddingBagConfig``s (a stand-in
with TorchRec's fields) builds in a job: the tables take the job's optimizer and lr, and the
job says so (cpu_dist/embeddings/foreign.py, train/job_model.py)."""

from __future__ import annotations

import pytest

from cpu_dist.common.flags import parse_args
from cpu_dist.common.validate import validate
from cpu_dist.embeddings import EmbeddingBagConfig, collections_of
from cpu_dist.models.factory import build_model
from cpu_dist.train.job_model import build_job_model
from cpu_dist.train.start_notes import start_notes

pytestmark = pytest.mark.timeout(60)


def write_model(tmp_path):
    model = tmp_path / "torchrec_model.py"
    model.write_text(
        "import torch\n"
        "from dataclasses import dataclass\n"
        "from cpu_dist.embeddings import EmbeddingBagCollection\n\n"
        "@dataclass\n"
        "class TRConfig:\n"
        "    num_embeddings: int\n    embedding_dim: int\n"
        "    name: str\n    feature_names: list\n\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self, tables):\n"
        "        super().__init__()\n"
        "        self.ebc = EmbeddingBagCollection([TRConfig(t.num_embeddings, t.embedding_dim,\n"
        "            t.name, list(t.feature_names)) for t in tables])\n"
        "        self.out = torch.nn.LazyLinear(1)\n"
        "    def forward(self, dense, sparse):\n"
        "        return self.out(torch.cat([dense, self.ebc(sparse).values()], 1)).squeeze(1)\n\n"
        "def make(tables, dense_features):\n"
        "    return M(tables)\n"
    )
    return model


def test_a_user_model_of_torchrec_configs_builds_in_a_job(tmp_path):
    """The job's model check (every table as declared) passes: without the job's optimizer
    and lr the converted tables would differ from the job's and be refused."""
    model = write_model(tmp_path)
    argv = ["--worker-num", "1", "--model", f"{model}:make", "--sparse-optimizer"]
    cfg = validate(parse_args([*argv, "rowwise_adagrad", "--sparse-lr", "0.05"]), 2)
    notes: list[str] = []
    build_job_model(cfg, 13, notes)
    assert len(notes) == len(cfg.tables.tables) and "optimizer rowwise_adagrad, lr 0.05" in notes[0]
    said = start_notes(cfg, notes)
    assert said[0].startswith("dense optimizer sgd (lr ") and said[1:] == notes


def test_an_export_or_bundle_rebuilds_it_from_its_own_tables(tmp_path):
    """Outside a job (export, serving), the tables the model is built around give the
    converted configs their fields: an Adagrad table rebuilds as Adagrad."""
    table = EmbeddingBagConfig(0, 4, "t", feature_names=["cat_0"], optimizer="adagrad", lr=0.02)
    model = build_model(f"{write_model(tmp_path)}:make", [table], 13, {}, seed=0)
    ((_, ebc),) = collections_of(model)
    assert ebc.embedding_bag_configs() == [table]
