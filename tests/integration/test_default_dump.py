"""The default job's bits are held: its --dump-state digest equals the one stored from
dcd30ea (tests/data/default_job_dump.sha256).  The guard the one-table-form work (issue 49)
and every later refactor of the default job's path must keep."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from .launch import ROOT, mpirun

pytestmark = pytest.mark.timeout(300)

DIGEST_FILE = ROOT / "tests" / "data" / "default_job_dump.sha256"
FLAGS = ["--worker-num", "2", "--max_step", "20", "--batch-size", "512"]


def dump_digest(path: Path) -> str:
    """sha256 over the arrays in name order, each as its name, dtype, shape and bytes."""
    h = hashlib.sha256()
    with np.load(path) as z:
        for name in sorted(z.files):
            a = np.ascontiguousarray(z[name])
            for part in (name, str(a.dtype), str(a.shape)):
                h.update(part.encode())
            h.update(a.tobytes())
    return h.hexdigest()


def stored_digest() -> str:
    lines = [s for s in DIGEST_FILE.read_text().splitlines() if s and not s.startswith("#")]
    assert len(lines) == 1, f"{DIGEST_FILE}: one digest line expected, got {lines}"
    return lines[0].strip()


def test_the_default_jobs_dump_is_bit_for_bit_the_stored_one(tmp_path):
    out = tmp_path / "dump.npz"
    proc = mpirun(3, [*FLAGS, "--dump-state", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert dump_digest(out) == stored_digest()
