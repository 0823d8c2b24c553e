"""Output paths before any training: nothing a flag names is overwritten unless it is an
earlier output of the same kind (``cpu_dist.common.files`` tells the kinds apart).  Refusals
are :class:`~cpu_dist.common.files.OutputError`s naming the flag; ``validate`` reports them
as every other refusal of the flags."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from cpu_dist.common.bundle_link import check_bundle_dir
from cpu_dist.common.files import (
    OutputError,
    check_output_dir,
    check_output_file,
    describe_dir,
    is_metrics_log,
    is_state_dump,
    is_tensorboard_dir,
    manifest_format,
)


def _check_checkpoint_kind(d: str) -> None:
    """Checkpoints go into ``step-NNNNNNNN/`` folders under ``--checkpoint-dir`` (and old ones
    are pruned there): a directory of another kind is no place for them."""
    p = Path(d)
    if p.is_dir() and (manifest_format(p) is not None or (p / "part.json").exists()):
        raise OutputError(
            f"--checkpoint-dir {d}: is {describe_dir(p)}, not a checkpoint directory "
            "(checkpoints go into step-NNNNNNNN/ folders under it); give its own directory"
        )


def check_outputs(a: argparse.Namespace) -> None:
    """Nothing a flag names is overwritten unless it is an earlier output of the same kind:
    each output path is missing, empty, or of its own kind, and no two paths (outputs, data,
    checkpoints) are the same."""
    if a.export:
        check_bundle_dir(a.export, "--export")  # (a dangling link of an earlier export too)
    if a.tensorboard:
        check_output_dir(
            a.tensorboard, "--tensorboard", "TensorBoard event files", is_tensorboard_dir
        )
    if a.dump_state:
        check_output_file(a.dump_state, "--dump-state", "a state dump (.npz)", is_state_dump)
    if a.metrics_out:
        check_output_file(
            a.metrics_out, "--metrics-out", "a metrics log (JSON lines)", is_metrics_log
        )
    if a.checkpoint_dir:
        _check_checkpoint_kind(a.checkpoint_dir)
    named = [
        (flag, os.path.realpath(path))
        for flag, path in (
            ("--export", a.export),
            ("--tensorboard", a.tensorboard),
            ("--dump-state", a.dump_state),
            ("--metrics-out", a.metrics_out),
            ("--checkpoint-dir", a.checkpoint_dir),
            ("--data-path", a.data_path),
            ("--ps-ssd-dir", a.ps_ssd_dir),
            ("--token-file", a.token_file),
        )
        if path
    ]
    for i, (flag, path) in enumerate(named):
        for other, other_path in named[i + 1 :]:
            if path == other_path:
                raise OutputError(
                    f"{flag} and {other} name the same path {path}: one would overwrite the other"
                )
