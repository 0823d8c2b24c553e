"""Run launcher.py under a real mpirun, as users do, and read back its --dump-state."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from cpu_dist.common.launch_env import mpi_env
from cpu_dist.train.reference import train_reference

ROOT = Path(__file__).resolve().parents[2]
MPI_ENV = {**mpi_env(), "PYTHONUNBUFFERED": "1"}  # this environment + scripts/env.sh
# A small model so a 20-step run takes seconds on two cores.
SMALL = [
    "--embedding-dim",
    "8",
    "--arch-mlp-bot",
    "16-8",
    "--arch-mlp-top",
    "16-1",
    "--batch-size",
    "96",
    "--max_step",
    "20",
    "--lr",
    "0.1",
    "--no-progress",
    "--eval-every",
    "0",
    "--eval-batches",
    "1",
    "--print-freq",
    "5",
]


def small_reference(
    dataset,
    steps: int = 20,
    batch_size: int = 96,
    sparse_optimizer: str = "sgd",
    dense_optimizer: str = "sgd",
    **rules: int,
) -> dict:
    """The single-process reference with SMALL's model and learning rates (and the job's
    default seeds and init scale); ``rules``: admit_after, expire_after."""
    return train_reference(
        dataset=dataset,
        steps=steps,
        batch_size=batch_size,
        dim=8,
        bot_mlp=[16, 8],
        top_mlp=[16, 1],
        seed=0,
        lr=0.1,
        sparse_lr=0.1,
        dense_optimizer=dense_optimizer,
        sparse_optimizer=sparse_optimizer,
        init_scale=8**-0.5,
        init_seed=0,
        dtype=torch.float32,
        **rules,
    )


def with_flags(flags: Sequence[str], changes: dict[str, str | None]) -> list[str]:
    """``flags`` with each named flag's value replaced (appended when absent; ``None``: the
    flag and its value removed), so tests vary SMALL without a second copy of it."""
    out = list(flags)
    for name, value in changes.items():
        if name in out:
            i = out.index(name)
            out[i : i + 2] = [] if value is None else [name, value]
        elif value is not None:
            out += [name, value]
    return out


def external_job(
    token_file: str, addresses: Sequence[str], *extra: str, workers: int = 1
) -> subprocess.CompletedProcess:
    """A SMALL job of ``workers`` ranks, all workers, on shards started elsewhere."""
    args = ["--worker-num", str(workers), "--ps_list", ",".join(addresses)]
    return mpirun(workers, [*args, "--token-file", token_file, *SMALL, *extra])


def run_module(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` in the checkout, as a user runs the tools (export, serving)."""
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def mpirun(np_: int, args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, **MPI_ENV}
    cmd = ["mpirun", "-np", str(np_), sys.executable, str(ROOT / "launcher.py"), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def train(tmp: Path, name: str, workers: int, shards: int, extra: list[str] = ()) -> dict:
    out = tmp / f"{name}.npz"
    proc = mpirun(
        workers + shards, ["--worker-num", str(workers), *SMALL, *extra, "--dump-state", str(out)]
    )
    assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    with np.load(out) as z:
        return {k: z[k] for k in z.files}
