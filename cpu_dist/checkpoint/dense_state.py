"""Worker 0's part of a checkpoint: dense parameters, dense optimizer state, random-number
state and the data position, in one torch file.  Every worker loads it on resume, so every
worker's optimizer continues from the same state (they all step on the same averaged grads)."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cpu_dist.common.files import atomic_write

from .manifest import CheckpointError, FileEntry


def _rng_state() -> dict:
    state = np.random.get_state(legacy=True)
    assert isinstance(state, tuple)
    kind, keys, pos, has_gauss, cached = state
    return {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.copy()), int(pos), int(has_gauss), float(cached)],
        "python": list(random.getstate()[1]),
        "python_version": random.getstate()[0],
        "python_gauss": random.getstate()[2],
    }


def _set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    kind, keys, pos, has_gauss, cached = s["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
    random.setstate((s["python_version"], tuple(s["python"]), s["python_gauss"]))


def save_dense(
    path: Path, model: torch.nn.Module, optimizer_state: dict[str, Any], step: int
) -> FileEntry:
    """``step``: the last step the state includes; training resumes at ``step + 1``.
    ``optimizer_state``: the dense optimizer's whole state (``DenseSync.optimizer_state``)."""
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer_state,
        "rng": _rng_state(),
        "step": int(step),
        "next_step": int(step) + 1,
    }
    buf = io.BytesIO()
    torch.save(state, buf)
    size, crc = atomic_write(path, lambda f: f.write(buf.getbuffer()))
    return FileEntry(file=path.name, bytes=size, crc32=crc)


def load_dense(path: Path, model: torch.nn.Module, step: int) -> dict[str, Any]:
    """Loads the model and the RNG state and returns the optimizer state, or raises
    CheckpointError naming the file (nothing is touched before the whole file is read and
    checked)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"checkpoint {path}: unreadable dense state ({exc})") from None
    if not isinstance(state, dict) or state.get("step") != step:
        raise CheckpointError(
            f"checkpoint {path}: holds step {state.get('step') if isinstance(state, dict) else '?'}"
            f", the manifest says {step}"
        )
    want = model.state_dict()
    got = state["model"]
    if set(got) != set(want) or any(
        got[k].shape != want[k].shape or got[k].dtype != want[k].dtype for k in want
    ):
        raise CheckpointError(
            f"checkpoint {path}: dense parameters do not match this model "
            f"(other --arch-mlp-bot/--arch-mlp-top/--dtype?)"
        )
    model.load_state_dict(got)
    _set_rng_state(state["rng"])
    optimizer_state: dict[str, Any] = state["optimizer"]
    return optimizer_state
