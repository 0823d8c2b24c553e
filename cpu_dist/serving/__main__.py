"""``python -m cpu_dist.serving BUNDLE_DIR [--config FILE] [data flags] [--eval-batches N]
[--scores-out FILE]``: score an exported model (any model: built-in or the user's) on the
evaluation batches a training job with the same data scores, and print one JSON line with
``eval_auc`` and ``eval_logloss``; ``--scores-out FILE`` also writes every scored row's
probability, one a line.  Needs neither MPI nor a parameter server nor the native module."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

from cpu_dist.common.config import DataConfig, TrainConfig
from cpu_dist.common.config_errors import ConfigError
from cpu_dist.common.files import atomic_write
from cpu_dist.common.flags import add_data_flags
from cpu_dist.common.job_file import JobFile, JobFileError, read_job_file
from cpu_dist.common.process_exit import skip_exit_collection
from cpu_dist.common.validate_data import data_config
from cpu_dist.data import dataset_for, eval_batches
from cpu_dist.data.features import BatchFeatures
from cpu_dist.models.outputs import logits_of
from cpu_dist.models.scoring import evaluate
from cpu_dist.serving.bundle import Bundle, BundleError, open_bundle
from cpu_dist.serving.loader import bundle_job_tables, load_bundle

# The data flags' dests (add_data_flags): a job file's [job] values for them are the data's.
DATA_DESTS = (
    "data",
    "data_path",
    "skip_bad_lines",
    "zipf_exponent",
    "num_embeddings_per_feature",
    "max_ind_range",
    "epochs",
    "shuffle",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m cpu_dist.serving", description=__doc__)
    ap.add_argument("bundle", help="directory written by --export or python -m cpu_dist.export")
    ap.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="a job file whose data to score: its [data] (kind, bags, weights) and the data "
        "flags of its [job]; the command line beats it, it beats the bundle's data settings",
    )
    add_data_flags(ap)
    # The bundle's data settings apply where the command line names none.
    ap.set_defaults(data=None, zipf_exponent=None)
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
        "--eval-batches",
        type=int,
        default=-1,
        help="global batches of the eval split to score; -1: all of it, the last partial "
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


def _kind(kind: str) -> str:
    return "synthetic data" if kind == "synthetic" else "Criteo data (--data criteo or criteo-bin)"


def _job_file(args: argparse.Namespace, given: set[str]) -> JobFile | None:
    """``--config``'s job file: its ``[data] kind`` and its ``[job]`` data flags become the
    data flags' values where the command line names none (``given``)."""
    if args.config is None:
        return None
    job_file = read_job_file(args.config)
    values = {k: v for k, v in job_file.job.items() if k in DATA_DESTS}
    if job_file.data_kind is not None:
        values["data"] = job_file.data_kind
    for key, value in values.items():
        if key not in given:
            setattr(args, key, value)
    return job_file


def bundle_data(
    args: argparse.Namespace, bundle: Bundle, job_file: JobFile | None = None
) -> DataConfig:
    """The data to score: the command line's flags, a ``--config`` job file's data, the
    bundle's settings where neither names them (a Criteo bundle's kind follows --data-path: a
    directory is a conversion); the bags and weights are the job file's, else the bundle's.
    Data of another kind, or hashed otherwise, would give other keys than the bundle's:
    refused."""
    a = argparse.Namespace(**vars(args))
    d = bundle.data
    if d is None:  # a version 1 bundle: the flags as given
        a.data = a.data or DataConfig.kind
        a.zipf_exponent = DataConfig.zipf_exponent if a.zipf_exponent is None else a.zipf_exponent
        return data_config(a)
    if a.data is None:
        path_is_dir = bool(a.data_path) and os.path.isdir(a.data_path)
        a.data = d.kind if d.family == "synthetic" else ("criteo-bin" if path_is_dir else "criteo")
    elif (a.data == "synthetic") != (d.family == "synthetic"):
        raise BundleError(
            f"bundle {bundle.path} was trained on {_kind(d.kind)}; --data {a.data} is another "
            "kind of data, whose keys are not the bundle's"
        )
    if a.zipf_exponent is None:
        a.zipf_exponent = d.zipf_exponent
    if d.family != "synthetic":
        if a.max_ind_range is None:
            a.max_ind_range = d.max_ind_range
        if a.num_embeddings_per_feature is None and d.num_embeddings_per_feature is not None:
            a.num_embeddings_per_feature = ",".join(map(str, d.num_embeddings_per_feature))
    cfg = data_config(a)
    for flag, got, want in (
        ("--max-ind-range", cfg.max_ind_range, d.max_ind_range),
        (
            "--num-embeddings-per-feature",
            cfg.num_embeddings_per_feature,
            d.num_embeddings_per_feature,
        ),
    ):
        if d.family != "synthetic" and got != want:

            def said(v: object, flag: str = flag) -> str:
                return f"no {flag}" if v is None else f"{flag} {v}"

            raise BundleError(
                f"bundle {bundle.path}: its keys were made with {said(want)}; {said(got)} "
                "would hash the data into other keys"
            )
    if job_file is not None and (job_file.bags or job_file.weights):
        return dataclasses.replace(cfg, bags=job_file.bags, weights=job_file.weights)
    return dataclasses.replace(cfg, bags=d.bags, weights=d.weights)


def probabilities(logits: np.ndarray) -> np.ndarray:
    """``sigmoid(logits)`` in float64, without overflow."""
    return np.exp(-np.logaddexp(0.0, -np.asarray(logits, dtype=np.float64)))


def write_scores(path: str | os.PathLike[str], logits: np.ndarray) -> None:
    """Every row's probability, in order, ``%.9g`` one a line, no header (written whole or
    not at all)."""
    p = probabilities(logits)
    text = "".join(f"{x:.9g}\n" for x in p.tolist()).encode()
    atomic_write(Path(os.path.abspath(path)), lambda f: f.write(text))


def score(args: argparse.Namespace, given: set[str] | None = None) -> dict[str, float]:
    if args.scores_out is not None and os.path.isdir(args.scores_out):
        raise ConfigError(f"--scores-out {args.scores_out}: is a directory; give a file")
    job_file = _job_file(args, given or set())
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
        for batch in eval_batches(dataset, args.batch_size, count):
            output = model(torch.from_numpy(batch.dense).to(dtype), features(batch))
            logits = logits_of(output, len(batch), record.name)  # [B] or [B, 1]: one check
            scores.append(logits.double().numpy())
            labels.append(batch.labels.astype(np.float64))
    if not scores:
        raise BundleError("the data has no evaluation batches")
    s, y = np.concatenate(scores), np.concatenate(labels)
    if len(s) != len(y):
        raise BundleError(
            f"model {record.name!r} returned {len(s)} logits for {len(y)} rows (expected [B])"
        )
    if args.scores_out:
        write_scores(args.scores_out, s)
    result = evaluate(s, y)
    return {
        "eval_auc": result["auc"],
        "eval_logloss": result["logloss"],
        "eval_samples": len(y),
        "steps": bundle.steps,
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
