"""A diverging run stops naming the cause on both sides (the dense parameters and the rows),
before a NaN reaches the PS as some sparse key's gradient (real mpirun job, real PS ranks)."""

from __future__ import annotations

import pytest

from .launch import SMALL, mpirun

pytestmark = pytest.mark.timeout(300)


def test_a_nan_loss_names_the_dense_parameters_and_the_rows():
    argv = ["--worker-num", "2", *SMALL, "--dense-optimizer", "adamw", "--lr", "0.5"]
    argv += ["--sparse-lr", "1000", "--max_step", "40", "--test-batches", "0"]
    proc = mpirun(3, argv)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "launcher.py: error:" in proc.stderr and "Traceback" not in proc.stderr
    assert "the loss is not finite (nan)" in proc.stderr, proc.stderr[-3000:]
    assert "the dense parameters are finite but the forward pass overflowed" in proc.stderr
    assert "the batch's embedding rows are finite (max |row|" in proc.stderr
    assert "non-finite gradient" not in proc.stderr and " in commit of session" not in proc.stderr
