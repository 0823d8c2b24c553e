"""A parameter-server rank never computes: the modules it runs (the launcher's job entry, its
preflight, the shard start) must not import torch, whose import costs each PS rank of every
job about 1.6 CPU-seconds here (measured with ``python -X importtime``)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import launcher, cpu_dist.train.job, cpu_dist.train.ps_rank
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print(loaded[:5])
sys.exit(1 if loaded else 0)
"""


def test_a_ps_rank_imports_no_torch():
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, f"torch modules imported: {out.stdout}{out.stderr}"
