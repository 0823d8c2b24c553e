"""The bundle records the data settings that made its keys; bundles of older versions (a
DLRM's settings instead of a model record; version 1 without data settings) still open,
unknown versions are refused naming the file."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from cpu_dist.serving.bundle import (
    BundleError,
    BundleWriter,
    DataSpec,
    ModelSpec,
    TableInfo,
    open_bundle,
)

SPEC = ModelSpec(4, 13, 26, (8, 4), (8, 1), "float32", 0, 0.5, "embedding")
DATA = DataSpec("criteo-bin", 5000, None, 1.05, 96)


def write(tmp_path, data=DATA):
    out = tmp_path / "b"
    w = BundleWriter(out, [TableInfo("embedding", 4, 3)])
    w.add("embedding", np.array([5, 1, 3]), np.arange(12, dtype=np.float32).reshape(3, 4))
    w.finish(SPEC, {"w": torch.zeros(2)}, 7, data)
    return out


def test_the_data_settings_travel_with_the_bundle(tmp_path):
    b = open_bundle(write(tmp_path))
    assert b.data == DATA and b.data.family == "criteo" and b.steps == 7
    assert b.model.name == "dlrm" and b.model.fused  # the default job's one table
    np.testing.assert_array_equal(b.keys, [1, 3, 5])


def as_version_2(out) -> None:
    """Rewrites a bundle as version 2 laid it out: its one table's arrays beside the
    manifest, no tables list."""
    m = json.loads((out / "manifest.json").read_text())
    for name in ("keys.npy", "rows.npy"):
        (out / "tables/embedding" / name).rename(out / name)
        m["files"][name] = m["files"].pop(f"tables/embedding/{name}")
    (out / "tables/embedding").rmdir()
    (out / "tables").rmdir()
    del m["tables"]
    m["version"] = 2
    (out / "manifest.json").write_text(json.dumps(m))


def test_a_version_1_bundle_opens_without_data_settings(tmp_path):
    out = write(tmp_path)
    as_version_3(out)
    as_version_2(out)
    m = json.loads((out / "manifest.json").read_text())
    del m["data"]
    m["version"] = 1
    (out / "manifest.json").write_text(json.dumps(m))
    assert open_bundle(out).data is None
    m["version"] = 9
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match=r"manifest.json: not a cpu_dist-export manifest of "):
        open_bundle(out)


def test_a_bundle_has_a_folder_per_table_and_the_one_table_view_refuses_several(tmp_path):
    out = tmp_path / "multi"
    w = BundleWriter(out, [TableInfo("item", 8, 2, {"seed": 3}), TableInfo("user", 2, 1)])
    w.add("user", np.array([7]), np.ones((1, 2), np.float32))
    w.add("item", np.array([9, -4]), np.arange(16, dtype=np.float32).reshape(2, 8))
    w.finish(SPEC, {"w": torch.zeros(2)}, 3, DATA)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.npy")) == [
        "tables/item/keys.npy",
        "tables/item/rows.npy",
        "tables/user/keys.npy",
        "tables/user/rows.npy",
    ]
    m = json.loads((out / "manifest.json").read_text())
    assert m["version"] == 5 and [t["name"] for t in m["tables"]] == ["item", "user"]
    # a DLRM's settings complete what a table's record lacks: the init scale, the seed
    assert m["tables"][0] == {"name": "item", "dim": 8, "rows": 2, "seed": 3, "init_scale": 0.5}
    assert m["tables"][1] == {"name": "user", "dim": 2, "rows": 1, "seed": 0, "init_scale": 0.5}
    assert m["model"]["name"] == "dlrm" and not m["model"]["fused"]
    b = open_bundle(out)
    np.testing.assert_array_equal(b.tables["item"].keys, [-4, 9])
    np.testing.assert_array_equal(b.tables["item"].rows[0], np.arange(8, 16))
    assert b.tables["user"].rows.shape == (1, 2)
    with pytest.raises(BundleError, match="holds tables 'item', 'user', not one"):
        b.only_table()
    # a damaged table file is named
    (out / "tables/user/rows.npy").write_bytes(b"x")
    with pytest.raises(BundleError, match=r"tables/user/rows\.npy: corrupt or truncated"):
        open_bundle(out)


def as_version_3(out) -> None:
    """Rewrites a bundle's manifest as version 3 wrote it: a DLRM's settings (ModelSpec's
    fields) as its model, no bags or weights in its data."""
    m = json.loads((out / "manifest.json").read_text())
    m["model"] = dataclasses.asdict(SPEC)
    for key in ("bags", "weights"):
        del m["data"][key]
    m["version"] = 3
    (out / "manifest.json").write_text(json.dumps(m))


def test_a_version_3_bundle_reads_as_the_builtin_dlrm(tmp_path):
    out = write(tmp_path)
    as_version_3(out)
    b = open_bundle(out)
    assert b.version == 3 and b.data == DATA
    assert (b.model.name, b.model.args) == ("dlrm", {"bot_mlp": [8, 4], "top_mlp": [8, 1]})
    assert (b.model.dense_features, b.model.seed, b.model.fused) == (13, 0, True)
    record = b.tables["embedding"].info.record
    assert record["features"] == [f"cat_{i}" for i in range(26)] and record["init_scale"] == 0.5


def test_a_version_2_bundle_still_opens(tmp_path):
    out = write(tmp_path)
    as_version_3(out)
    as_version_2(out)
    b = open_bundle(out)
    np.testing.assert_array_equal(b.keys, [1, 3, 5])
    assert list(b.tables) == ["embedding"] and b.rows.shape == (3, 4)


def test_table_names_must_be_plain_folders(tmp_path):
    for bad in ("../x", "a/b", ".hidden", ""):
        with pytest.raises(BundleError, match="cannot be a bundle folder"):
            BundleWriter(tmp_path / "b", [TableInfo(bad, 4, 0)])


def test_messages_name_the_bundle_path_as_given_not_its_hidden_version(
    tmp_path, monkeypatch, capsys
):
    """An export's DIR is a link to a hidden version directory (``.DIR.v-...``); what is
    wrong with the bundle is said of DIR, the path the user typed (was: the hidden one)."""
    from cpu_dist.serving.__main__ import main

    out = write(tmp_path)
    assert out.is_symlink()
    monkeypatch.chdir(tmp_path)
    b = open_bundle("b")
    assert str(b.path) == "b" and b.root.name.startswith(".b.v-")
    assert main(["b", "--data", "synthetic"]) == 2
    assert capsys.readouterr().err.startswith("error: bundle b was trained on Criteo data")
    for damage, said in (
        (lambda: (out / "dense.pt").write_bytes(b"x"), "bundle b/dense.pt: corrupt or truncated"),
        (lambda: (out / "dense.pt").unlink(), "bundle b/dense.pt: unreadable (No such file"),
        (lambda: (out / "manifest.json").write_text("{"), "bundle b/manifest.json: unreadable"),
    ):
        damage()
        with pytest.raises(BundleError) as err:
            open_bundle("b")
        assert str(err.value).startswith(said) and ".v-" not in str(err.value)
