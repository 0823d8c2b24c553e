"""``export_job``: the bundle a job writes at its end, for any model (here a user model from a
file outside the package, over two tables of its own widths, optimizers and poolings): the
record names the model, its arguments and its copied source, each table's record is its
``EmbeddingBagConfig``, the rows are the shards', and ``cpu_dist.serving.load`` scores what the
job's model scores with those rows."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch

from cpu_dist.common.config import Config, JobConfig, ModelConfig, TrainConfig
from cpu_dist.common.tables import JobTables, TableConfig
from cpu_dist.embeddings import KeyedJaggedTensor, collections_of, configs_of
from cpu_dist.export import export_job
from cpu_dist.models.factory import build_model
from cpu_dist.serving import load
from cpu_dist.serving.bundle import open_bundle
from cpu_dist.serving.rows import BundleRows, TableRows
from cpu_dist.sparse import Client, Server

pytestmark = pytest.mark.timeout(120)
TOKEN = "export-job"
SEED = 4
MODEL = """
import torch
from torch import nn

from cpu_dist.embeddings import EmbeddingBagCollection


class Wide(nn.Module):
    def __init__(self, tables, dense_features, hidden):
        super().__init__()
        self.towers = nn.ModuleDict({"ebc": EmbeddingBagCollection(tables)})
        width = sum(t.embedding_dim * len(t.feature_names) for t in tables)
        self.head = nn.Sequential(nn.Linear(width + dense_features, hidden), nn.ReLU(),
                                  nn.Linear(hidden, 1))

    def forward(self, dense, sparse):
        x = torch.cat([self.towers["ebc"](sparse).values(), dense], dim=1)
        return self.head(x).squeeze(-1)


def build(tables, dense_features, *, hidden=8):
    return Wide(tables, dense_features, hidden)
"""


def test_a_jobs_user_model_exports_and_serves(tmp_path):
    src = tmp_path / "user" / "wide.py"
    src.parent.mkdir()
    src.write_text(textwrap.dedent(MODEL))
    spec = f"{src}:build"
    jt = JobTables(
        (
            TableConfig("u", 4, ("cat_0",), init_scale=0.2),
            TableConfig("v", 2, ("cat_1", "cat_2"), optimizer="adagrad", pooling="mean"),
        )
    )
    cfg = Config(
        job=JobConfig(worker_num=1, num_ps_ranks=1),
        model=ModelConfig(name=spec, args=(("hidden", 6),)),
        train=TrainConfig(seed=SEED),
        tables=jt,
    )
    tables = configs_of(jt, seed=SEED)
    model = build_model(spec, tables, 13, {"hidden": 6}, seed=SEED)
    for _, ebc in collections_of(model):  # distributed, as in a job: no rows in its state
        ebc.set_row_source(BundleRows({}))
    server = Server(0, TOKEN, tables=jt.specs(SEED))
    server.start()
    try:
        client = Client(
            [server.address], TOKEN, tables=[(t.name, t.dim) for t in jt.tables], timeout_s=30.0
        )
        rng = np.random.default_rng(0)
        parts = {}
        for t in jt.tables:
            keys = np.unique(rng.integers(0, 50, 30)).astype(np.int64)
            parts[t.name] = (keys, rng.standard_normal((len(keys), t.dim)).astype("f4"), 0.1)
        client.push_tables(parts)
        want = {t.name: client.dump(table=t.name) for t in jt.tables}
        out = tmp_path / "bundle"
        rows = export_job(
            cfg, model, client, 5, out, dense_features=13, name=spec, args={"hidden": 6}
        )
        client.close()
    finally:
        server.stop(2.0)
    assert rows == sum(len(w[0]) for w in want.values())
    m = json.loads((out / "manifest.json").read_text())
    assert m["model"]["name"] == spec and m["model"]["args"] == {"hidden": 6}
    assert m["model"]["source"]["kind"] == "file" and (out / "model/wide.py").is_file()
    assert not m["model"]["fused"] and m["data"]["batch_size"] == cfg.train.batch_size
    for rec, c in zip(m["tables"], tables):
        spec_keys = c.spec(SEED)
        assert {k: rec[k] for k in spec_keys} == spec_keys  # the shard's spec, as checkpoints
        assert (rec["features"], rec["pooling"], rec["lr"]) == (
            list(c.feature_names),
            c.pooling.mode,
            c.lr,
        )
    b = open_bundle(out)
    assert b.steps == 5 and list(b.tables) == ["u", "v"]
    served = load(out)
    source = BundleRows(
        {
            t.name: TableRows(t.name, want[t.name][0], want[t.name][1], SEED, t.init_scale)
            for t in jt.tables
        }
    )
    for _, ebc in collections_of(model):  # the job's model over the shards' rows
        ebc.set_row_source(source)
    model.eval()
    values = torch.tensor([3, 49, 7, 8, 200, 1, 2, 3, 4, 5, 6, 7])  # 200: never touched
    lengths = torch.tensor([1, 1, 1, 1, 2, 0, 1, 1, 2, 1, 1, 0])
    kjt = KeyedJaggedTensor(["cat_0", "cat_1", "cat_2"], values, lengths=lengths)
    dense = torch.randn(4, 13)
    with torch.no_grad():
        torch.testing.assert_close(served(dense, kjt), model(dense, kjt), rtol=0, atol=0)
