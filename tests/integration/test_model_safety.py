"""What a trained model must survive: a table too big for one reply is still dumped whole, and
a run whose gradients overflow stops at the first non-finite step, naming it, instead of
poisoning the table and going on.  Real mpirun jobs with a real PS rank."""

from __future__ import annotations

import numpy as np
import pytest

from .launch import mpirun

pytestmark = pytest.mark.timeout(600)
# Wide rows, big batches of flatter (Zipf 0.6) ids, small MLPs: a one-reply Dump of this
# table (> 262k rows of D=64) would be over gRPC's 64 MiB message limit.
WIDE = [
    "--embedding-dim",
    "64",
    "--arch-mlp-bot",
    "16-64",
    "--arch-mlp-top",
    "16-1",
    "--batch-size",
    "4096",
    "--zipf-exponent",
    "0.6",
    "--no-progress",
    "--eval-every",
    "0",
    "--eval-batches",
    "1",
]


def test_a_table_beyond_one_message_is_dumped_whole(tmp_path):
    out = tmp_path / "model.npz"
    proc = mpirun(3, ["--worker-num", "2", *WIDE, "--max_step", "12", "--dump-state", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out) as z:
        keys, values = z["table/embedding/keys"], z["table/embedding/values"]
        assert len(keys) > 262_144 and values.shape == (len(keys), 64)
        assert values.nbytes > 64 << 20
        assert np.all(np.diff(keys) > 0) and np.isfinite(values).all()
        assert any(k.startswith("dense/") for k in z.files)


def test_a_run_whose_gradients_overflow_stops_at_the_bad_step(tmp_path):
    proc = mpirun(
        3,
        ["--worker-num", "2", *WIDE, "--batch-size", "256", "--max_step", "50", "--lr", "1e30"],
    )
    assert proc.returncode != 0
    assert "not finite" in proc.stderr, proc.stderr[-3000:]
    assert "step" in proc.stderr and "rank" in proc.stderr
