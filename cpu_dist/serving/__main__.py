"""``python -m cpu_dist.serving BUNDLE_DIR [--config FILE] [data flags] [--split S]
[--eval-batches N] [--scores-out FILE]``: score an exported model (any model: built-in or the
user's) on the evaluation batches a training job with the same data scores (``--split``: the
test or train split, or every row of the file, instead), and print one JSON line with
``eval_auc``, ``eval_logloss``, ``eval_ne``, ``eval_calibration`` and ``eval_ctr`` (a job's
eval line's figures); ``--scores-out FILE`` also writes every scored row's probability, one a
line.  The data is the bundle's (``serving.data``: a version 5 bundle
records all its job read) unless the command line or ``--config`` names it.  Needs neither
MPI nor a parameter server nor the native module."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

from cpu_dist.common.config import TrainConfig
from cpu_dist.common.config_errors import ConfigError
from cpu_dist.common.files import atomic_write
from cpu_dist.common.flags import add_data_flags
from cpu_dist.common.job_file import JobFileError
from cpu_dist.common.process_exit import skip_exit_collection
from cpu_dist.data import dataset_for
from cpu_dist.data.features import BatchFeatures
from cpu_dist.models.outputs import logits_of
from cpu_dist.models.scoring import evaluate
from cpu_dist.serving.bundle import BundleError, open_bundle
from cpu_dist.serving.data import DATA_DESTS, SPLITS, bundle_data, read_config, split_batches
from cpu_dist.serving.loader import bundle_job_tables, load_bundle


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m cpu_dist.serving", description=__doc__)
    ap.add_argument("bundle", help="directory written by --export or python -m cpu_dist.export")
    ap.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="a job file whose data to score: its [data] (kind, path, bags, weights, columns) "
        "and the data flags of its [job]; the command line beats it, it beats the bundle's "
        "data settings, and what would read the data otherwise than the job did is refused",
    )
    add_data_flags(ap)
    # The bundle's data settings apply where the command line names none.
    ap.set_defaults(data=None, zipf_exponent=None, multi_hot_distribution=None)
    ap.add_argument(
        "--seed", type=int, default=None, help="the job's --seed (default: the bundle's)"
    )
    ap.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"global batch (default: the job's, from the bundle; else {TrainConfig.batch_size})",
    )
    ap.add_argument(
        "--split",
        choices=SPLITS,
        default="eval",
        help="the rows to score: the eval split (a job's final evaluation's), the test or "
        "train split, or every row of the data in file order (all; not for synthetic data)",
    )
    ap.add_argument(
        "--eval-batches",
        type=int,
        default=-1,
        help="global batches of the split to score; -1: all of it, the last partial "
        "batch included, as a job's final evaluation scores by default (the endless "
        "synthetic stream: 4)",
    )
    ap.add_argument(
        "--scores-out",
        default=None,
        metavar="FILE",
        help="write the probability (sigmoid of the logit) of every scored row, in the "
        "input's order, '%%.9g' one a line, no header",
    )
    ap.add_argument("--no-check", action="store_true", help="skip the files' checksums")
    return ap.parse_args(argv)


def probabilities(logits: np.ndarray) -> np.ndarray:
    """``sigmoid(logits)`` in float64, without overflow."""
    return np.exp(-np.logaddexp(0.0, -np.asarray(logits, dtype=np.float64)))


def write_scores(path: str | os.PathLike[str], logits: np.ndarray) -> None:
    """Every row's probability, in order, ``%.9g`` one a line, no header (written whole or
    not at all)."""
    p = probabilities(logits)
    text = "".join(f"{x:.9g}\n" for x in p.tolist()).encode()
    atomic_write(Path(os.path.abspath(path)), lambda f: f.write(text))


def score(args: argparse.Namespace, given: set[str] | None = None) -> dict[str, object]:
    if args.scores_out is not None and os.path.isdir(args.scores_out):
        raise ConfigError(f"--scores-out {args.scores_out}: is a directory; give a file")
    job_file = read_config(args, given or set())
    bundle = open_bundle(args.bundle, check=not args.no_check)
    record = bundle.model
    if args.batch_size is None:
        args.batch_size = bundle.data.batch_size if bundle.data else TrainConfig.batch_size
    if args.eval_batches == 0 or args.eval_batches < -1 or args.batch_size <= 0:
        raise ConfigError(
            f"--eval-batches {args.eval_batches}, --batch-size {args.batch_size}: need -1 "
            "(all) or a positive number of batches, and a positive batch size"
        )
    seed = record.seed if args.seed is None else args.seed
    dataset = dataset_for(bundle_data(args, bundle, job_file), seed)
    count = None if args.eval_batches == -1 else args.eval_batches
    dtype = torch.float64 if record.dtype == "float64" else torch.float32
    model = load_bundle(bundle)
    features = BatchFeatures(
        bundle_job_tables(bundle), dataset.kind, getattr(dataset, "offsets", None)
    )
    scores, labels = [], []
    with torch.no_grad():
        for batch in split_batches(dataset, args.split, args.batch_size, count):
            output = model(torch.from_numpy(batch.dense).to(dtype), features(batch))
            logits = logits_of(output, len(batch), record.name)  # [B] or [B, 1]: one check
            scores.append(logits.double().numpy())
            labels.append(batch.labels.astype(np.float64))
    if not scores:
        raise BundleError(f"the data has no rows in its {args.split} split (--split)")
    s, y = np.concatenate(scores), np.concatenate(labels)
    if len(s) != len(y):
        raise BundleError(
            f"model {record.name!r} returned {len(s)} logits for {len(y)} rows (expected [B])"
        )
    if args.scores_out:
        write_scores(args.scores_out, s)
    result = evaluate(s, y)  # auc, logloss, ne, calibration, ctr: a job's eval line's
    return {
        **{f"eval_{k}": v for k, v in result.items()},
        "eval_samples": len(y),
        "steps": bundle.steps,
        "split": args.split,
    }


def _given(argv: list[str] | None) -> set[str]:
    """The data flags' dests the command line names (they beat a job file's)."""
    words = sys.argv[1:] if argv is None else argv
    flags = {w.split("=", 1)[0] for w in words if w.startswith("--")}
    return {d for d in DATA_DESTS if f"--{d.replace('_', '-')}" in flags}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        print(json.dumps(score(args, _given(argv))), flush=True)
    except (BundleError, ConfigError, JobFileError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    code = main()
    skip_exit_collection()
    sys.exit(code)
