"""``python -m cpu_dist.export`` of a checkpoint of several tables: a folder per table in the
bundle, each with exactly the rows the shards held (dump compare), the tables' specs and the
model (from the checkpoint's settings) in its manifest; the bundle opens, its one-table view
refuses it naming the tables, and ``cpu_dist.serving.load`` rebuilds its DLRM."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cpu_dist.checkpoint.dense_state import save_dense
from cpu_dist.checkpoint.manifest import FileEntry, Manifest, step_dir_name, steps_done
from cpu_dist.common.contracts import row_init
from cpu_dist.embeddings import KeyedJaggedTensor
from cpu_dist.export.__main__ import main
from cpu_dist.models.factory import build_model
from cpu_dist.serving import load
from cpu_dist.serving.bundle import BundleError, open_bundle
from cpu_dist.serving.model_record import table_config
from cpu_dist.serving.rows import BundleRows
from cpu_dist.sparse import Client, Server

pytestmark = pytest.mark.timeout(120)
TOKEN = "export-tables"
SPECS = [
    {"name": "ads", "dim": 8, "optimizer": "sgd", "init_scale": 0.5, "seed": 3},
    {"name": "user", "dim": 4, "optimizer": "adagrad", "init_scale": 0.25, "seed": 3, "eps": 1e-8},
]
SETTINGS = {
    "model.embedding_dim": 8,
    "model.bot_mlp": [8],
    "model.top_mlp": [1],
    "model.dtype": "float32",
    "model.init_scale": 0.5,
    "train.seed": 3,
    "train.batch_size": 32,
    "data.kind": "synthetic",
}


def two_feature_dlrm() -> torch.nn.Module:
    """The job's DLRM over the two tables, its collection distributed as in a job (so its
    dense state holds no rows)."""
    tables = [table_config({**t, "features": [f"cat_{i}"]}, "test") for i, t in enumerate(SPECS)]
    model = build_model("dlrm", tables, 13, {"bot_mlp": [8], "top_mlp": [1]}, seed=3)
    model.embedding.set_row_source(BundleRows({}))
    return model


def test_a_checkpoint_of_several_tables_exports_a_folder_per_table(tmp_path):
    root = tmp_path / "ck"
    servers = [
        Server(0, TOKEN, tables=SPECS, shard_index=i, num_shards=2, checkpoint_dir=str(root))
        for i in range(2)
    ]
    for s in servers:
        s.start()
    try:
        client = Client(
            [s.address for s in servers],
            TOKEN,
            tables=[(t["name"], t["dim"]) for t in SPECS],
            timeout_s=30.0,
        )
        rng = np.random.default_rng(1)
        parts = {}
        for t in SPECS:
            keys = np.unique(rng.integers(0, 10**9, 300)).astype(np.int64)
            parts[t["name"]] = (keys, rng.standard_normal((len(keys), t["dim"])).astype("f4"), 0.1)
        client.push_tables(parts)
        want = {t["name"]: client.dump(table=t["name"]) for t in SPECS}
        name = step_dir_name(steps_done(6))
        step_dir = root / name
        step_dir.mkdir(parents=True)
        files = [f"shard-{i:05d}-of-00002.bin" for i in range(2)]
        res = client.save([f"{name}/{f}" for f in files], 6)
    finally:
        for s in servers:
            s.stop(2.0)
    model = two_feature_dlrm()
    dense = save_dense(step_dir / "dense.pt", model, {}, 6)
    tables = [{**t, "features": [f"cat_{i}"]} for i, t in enumerate(SPECS)]
    Manifest(
        step=6,
        table="ads",
        dim=8,
        num_shards=2,
        shards=[
            FileEntry(f, int(r["bytes"]), int(r["checksum"]), int(r["rows"]))
            for f, r in zip(files, res)
        ],
        dense=dense,
        config=SETTINGS,
        tables=tables,
    ).write(step_dir)

    out = tmp_path / "bundle"
    assert main([str(root), "--output", str(out)]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert [t["name"] for t in m["tables"]] == ["ads", "user"]
    assert m["tables"][1]["optimizer"] == "adagrad" and m["tables"][1]["features"] == ["cat_1"]
    b = open_bundle(out)
    for t in SPECS:
        keys, values, _ = want[t["name"]]
        got = b.tables[t["name"]]
        np.testing.assert_array_equal(got.keys, keys)
        np.testing.assert_array_equal(got.rows, values)
        assert got.rows.shape == (len(keys), t["dim"])
    with pytest.raises(BundleError, match="holds tables 'ads', 'user'"):
        b.only_table()
    assert (b.model.name, b.model.args) == ("dlrm", {"bot_mlp": [8], "top_mlp": [1]})
    assert not b.model.fused and b.model.dense_features == 13 and b.model.seed == 3
    served = load(out)  # the DLRM over both tables, the shards' rows as its row source
    ads_keys, ads_rows, _ = want["ads"]
    order = np.argsort(ads_keys)
    unseen = np.int64(-7)
    ids = np.sort(np.append(ads_keys[order[:3]], unseen))
    looked = served.embedding.row_source.lookup("ads", ids).numpy()
    np.testing.assert_array_equal(looked[1:], ads_rows[order[:3]])
    np.testing.assert_array_equal(looked[0], row_init(3, [unseen], 8, 0.5, "ads")[0])
    for name, value in served.state_dict().items():
        torch.testing.assert_close(value, b.dense[name], rtol=0, atol=0)
    kjt = KeyedJaggedTensor(
        ["cat_0", "cat_1"], torch.tensor([ads_keys[0], 5, 6, 9]), lengths=torch.ones(4).long()
    )
    with torch.no_grad():
        assert served(torch.zeros(2, 13), kjt).shape == (2,)
