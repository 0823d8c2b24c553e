"""The reference takes a model's logits as the job does (``cpu_dist.models.outputs.logits_of``):
``[B, 1]`` (TorchRec's own model classes) trains to the bits of ``[B]``; any other shape is one
line naming the model and the shape, exit 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cpu_dist.common.flags import parse_args
from cpu_dist.common.validate import validate
from cpu_dist.reference import train_reference
from cpu_dist.reference.__main__ import main as reference_main

pytestmark = pytest.mark.timeout(60)

# The built-in DLRM, its logits reshaped as the job file's [model] shape says.
SHAPED = """
from cpu_dist.models.dlrm import dlrm
from torch import nn


class Shaped(nn.Module):
    def __init__(self, inner, shape):
        super().__init__()
        self.inner, self.shape = inner, shape

    def forward(self, dense, sparse):
        logits = self.inner(dense, sparse)
        if self.shape == "b1":
            return logits.unsqueeze(1)
        if self.shape == "b2":
            return logits.unsqueeze(1).expand(-1, 2)
        return logits


def build(tables, dense_features, shape="b"):
    return Shaped(dlrm(tables, dense_features, bot_mlp=[4], top_mlp=[8, 1]), shape)
"""
FLAGS = [
    *("--worker-num", "1", "--embedding-dim", "4", "--batch-size", "8", "--max_step", "3"),
    *("--lr", "0.1", "--eval-batches", "1"),
]


def _model_file(tmp_path: Path) -> Path:
    path = tmp_path / "shaped.py"
    path.write_text(SHAPED)
    return path


def _job(tmp_path: Path, shape: str) -> str:
    job = tmp_path / f"{shape}.toml"
    job.write_text(f'[model]\nname = "{_model_file(tmp_path)}:build"\nshape = "{shape}"\n')
    return str(job)


def test_a_b1_model_trains_as_the_same_b_model(tmp_path):
    """The reference (the job's own step: the same ``logits_of``) trains a model that returns
    ``[B, 1]`` to the same bits as the model returning ``[B]``; before, BCEWithLogitsLoss
    refused the shape with a traceback."""
    dumps = {
        shape: train_reference(validate(parse_args([*FLAGS, "--config", _job(tmp_path, shape)]), 2))
        for shape in ("b", "b1")
    }
    assert set(dumps["b"]) == set(dumps["b1"])
    for k in dumps["b"]:
        np.testing.assert_array_equal(dumps["b1"][k], dumps["b"][k], err_msg=k)


def test_the_reference_names_the_model_and_the_shape_in_one_line(tmp_path, capsys):
    job = _job(tmp_path, "b2")
    assert reference_main([*FLAGS, "--config", job]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("cpu_dist.reference: error: model ")
    assert "shape [8, 2] for a batch of 8 rows; expected [B] or [B, 1]" in err[0]
