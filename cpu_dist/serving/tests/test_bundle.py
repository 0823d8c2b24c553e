"""The bundle records the data settings that made its keys; version 1 bundles (without them)
still open, unknown versions are refused naming the file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cpu_dist.serving.bundle import BundleError, BundleWriter, DataSpec, ModelSpec, open_bundle

SPEC = ModelSpec(4, 13, 26, (8, 4), (8, 1), "float32", 0, 0.5, "t")
DATA = DataSpec("criteo-bin", 5000, None, 1.05, 96)


def write(tmp_path, data=DATA):
    out = tmp_path / "b"
    w = BundleWriter(out, 4, 3)
    w.add(np.array([5, 1, 3]), np.arange(12, dtype=np.float32).reshape(3, 4))
    w.finish(SPEC, {"w": torch.zeros(2)}, 7, data)
    return out


def test_the_data_settings_travel_with_the_bundle(tmp_path):
    b = open_bundle(write(tmp_path))
    assert b.data == DATA and b.data.family == "criteo" and b.steps == 7
    np.testing.assert_array_equal(b.keys, [1, 3, 5])


def test_a_version_1_bundle_opens_without_data_settings(tmp_path):
    out = write(tmp_path)
    m = json.loads((out / "manifest.json").read_text())
    del m["data"]
    m["version"] = 1
    (out / "manifest.json").write_text(json.dumps(m))
    assert open_bundle(out).data is None
    m["version"] = 9
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match=r"manifest.json: not a cpu_dist-export manifest of "):
        open_bundle(out)
