"""Consistent checkpoints of a training job: PS shard files, worker 0's dense state, a manifest.

Layout of ``--checkpoint-dir DIR`` (see docs/operations.md, "Checkpoints and faults"):

    DIR/OWNER.json                               the run that holds DIR (owner.py)
    DIR/step-00000123/shard-00000-of-00002.bin   after 123 steps: one per PS shard (its own file)
    DIR/step-00000123/dense.pt                   dense params, optimizer, RNG, data position
    DIR/step-00000123/manifest.json              written last: a directory without one is ignored
"""

from __future__ import annotations

from .manifest import (
    FORMAT_VERSION,
    CheckpointError,
    Manifest,
    find_latest,
    read_manifest,
    step_dir_name,
    steps_done,
)

__all__ = [
    "FORMAT_VERSION",
    "CheckpointError",
    "Manifest",
    "find_latest",
    "read_manifest",
    "step_dir_name",
    "steps_done",
]
