"""torch's dense optimizers (``--dense-optimizer sgd|adam|adamw|adagrad`` with their settings)
under real jobs: each equals the single-process reference on both dense paths (all-reduce,
ZeRO-1) and worker counts, and a resumed run ends with the bits of one never stopped (the
optimizer state in the checkpoint's dense state).  A small grid of real jobs; the two dense
paths for every optimizer (SGD with momentum too), with their state's round trip, are
tests/mpi/test_dense_sync.py's.
"""

from __future__ import annotations

import json
import shutil

import pytest

from cpu_dist.data import make_dataset

from .launch import assert_dumps_close, assert_dumps_equal, small_reference, train

pytestmark = pytest.mark.timeout(400)
STEPS = 8
# Adam and AdamW divide by sqrt(v): the last-bit difference of a W-way gradient sum against
# the one-process sum (float32 rows and sparse gradients included) becomes, for a dense
# gradient near zero, a visible part of one step.  In float32 that is ~1e-3 of a weight on
# 0.6% of top.0.weight (test_equivalence.py's adamw test); in float64 rtol 1e-5 holds but for
# a few such weights (3 of 5744, 1.5e-5 apart: 1.5e-4 of a step at lr 0.1), hence ADAM_ATOL.
F64 = ["--dtype", "float64"]
ADAM_ATOL = 5e-5


def reference(flags: list[str]) -> dict:
    """The single-process reference of a SMALL job of ``flags`` (cpu_dist.reference)."""
    return small_reference(
        make_dataset("synthetic", seed=0), steps=STEPS, flags=["--max_step", str(STEPS), *flags]
    )


@pytest.mark.parametrize(
    "workers,flags",
    [
        pytest.param(
            3,
            [
                "--dense-optimizer",
                "adam",
                "--weight-decay",
                "0.01",
                "--dense-sync",
                "reduce_scatter",
            ],
            id="adam-zero1-w3",
        ),
        pytest.param(
            1,
            ["--dense-optimizer", "adagrad", "--eps", "1e-8", "--weight-decay", "0.001"],
            id="adagrad-allreduce-w1",
        ),
    ],
)
def test_each_dense_optimizer_equals_the_reference(tmp_path, workers, flags):
    got = train(tmp_path, "job", workers, 1, ["--max_step", str(STEPS), *flags])
    atol = ADAM_ATOL if "adam" in flags else 1e-6
    assert_dumps_close(got, reference(flags), 1e-5, f"W={workers} {' '.join(flags)}", atol=atol)


def test_adamw_w3_equals_the_reference_and_resumes_bit_for_bit(tmp_path):
    """An 8-step run checkpoints after steps 4 and 8; its step-8 checkpoint removed, a resumed
    run trains steps 5..8 from the step-4 one (parameters and AdamW's moments and step count)
    and ends with the same bits."""
    flags = ["--dense-optimizer", "adamw", "--betas", "0.8,0.99", "--weight-decay", "0.05", *F64]
    d = tmp_path / "ck"
    ckpt = ["--checkpoint-dir", str(d), "--checkpoint-every", "4"]
    whole = train(tmp_path, "whole", 3, 1, ["--max_step", str(STEPS), *flags, *ckpt])
    assert_dumps_close(whole, reference(flags), 1e-5, "adamw W=3", atol=ADAM_ATOL)
    newest = d / f"step-{STEPS:08d}"
    assert json.loads((newest / "manifest.json").read_text())["step"] == STEPS - 1
    shutil.rmtree(newest)
    resumed = train(
        tmp_path, "resumed", 3, 1, ["--max_step", str(STEPS), *flags, *ckpt, "--resume"]
    )
    assert_dumps_equal(resumed, whole, "adamw W=3 resumed")
