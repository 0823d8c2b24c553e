"""``import cpu_dist`` stays light: the embeddings API is re-exported from it but loaded (with
torch) only when one of its names is first read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(60)


def test_import_cpu_dist_loads_no_torch_until_a_name_is_read():
    script = (
        "import sys, cpu_dist\n"
        "assert 'torch' not in sys.modules and 'cpu_dist.embeddings' not in sys.modules\n"
        "from cpu_dist import KeyedJaggedTensor, EmbeddingBagCollection\n"
        "import cpu_dist.embeddings as e\n"
        "assert KeyedJaggedTensor is e.KeyedJaggedTensor and 'torch' in sys.modules\n"
        "try:\n"
        "    cpu_dist.nothing\n"
        "except AttributeError as exc:\n"
        "    assert 'nothing' in str(exc)\n"
        "print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=50
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
