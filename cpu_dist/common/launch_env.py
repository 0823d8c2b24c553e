"""The environment this project's mpirun jobs run in, read from ``scripts/env.sh``.

Tests and benchmarks start ``mpirun`` from Python; they take their environment from the
same script users source, so there is one list of OpenMPI settings, not one per caller.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

ENV_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "env.sh"


def mpi_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``scripts/env.sh`` applied."""
    base = dict(os.environ if base is None else base)
    if not ENV_SCRIPT.is_file():  # an installed package without the source tree
        return base
    out = subprocess.run(
        ["bash", "-c", f'source "{ENV_SCRIPT}" && env -0'],
        env=base,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
