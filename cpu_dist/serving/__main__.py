"""``python -m cpu_dist.serving BUNDLE_DIR [data flags] --eval-batches N``: score an exported
model on the evaluation batches a training job with the same data flags scores, and print one
JSON line with ``eval_auc`` and ``eval_logloss``.  Needs neither MPI nor a parameter server
nor the native module."""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

from cpu_dist.common.config import DataConfig, TrainConfig
from cpu_dist.common.flags import add_data_flags
from cpu_dist.common.validate import ConfigError, data_config
from cpu_dist.data import dataset_for, eval_batches
from cpu_dist.models.dlrm import build_dlrm
from cpu_dist.models.scoring import evaluate
from cpu_dist.serving.bundle import Bundle, BundleError, open_bundle
from cpu_dist.serving.embedding import BundleEmbedding


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m cpu_dist.serving", description=__doc__)
    ap.add_argument("bundle", help="directory written by --export or python -m cpu_dist.export")
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
    ap.add_argument("--no-check", action="store_true", help="skip the files' checksums")
    return ap.parse_args(argv)


def _kind(kind: str) -> str:
    return "synthetic data" if kind == "synthetic" else "Criteo data (--data criteo or criteo-bin)"


def bundle_data(args: argparse.Namespace, bundle: Bundle) -> DataConfig:
    """The data to score: the command line's flags, the bundle's settings where it names none
    (a Criteo bundle's kind follows --data-path: a directory is a conversion).  Data of another
    kind, or hashed otherwise, would give other keys than the bundle's: refused."""
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
    return cfg


def score(args: argparse.Namespace) -> dict[str, float]:
    bundle = open_bundle(args.bundle, check=not args.no_check)
    spec = bundle.spec
    if args.batch_size is None:
        args.batch_size = bundle.data.batch_size if bundle.data else TrainConfig.batch_size
    if args.eval_batches == 0 or args.eval_batches < -1 or args.batch_size <= 0:
        raise ConfigError(
            f"--eval-batches {args.eval_batches}, --batch-size {args.batch_size}: need -1 "
            "(all) or a positive number of batches, and a positive batch size"
        )
    seed = spec.seed if args.seed is None else args.seed
    dataset = dataset_for(bundle_data(args, bundle), seed)
    count = None if args.eval_batches == -1 else args.eval_batches
    dtype = torch.float64 if spec.dtype == "float64" else torch.float32
    embedding = BundleEmbedding(bundle.keys, bundle.rows, spec.seed, spec.init_scale)
    model = build_dlrm(
        embedding,
        dim=spec.dim,
        num_dense=spec.num_dense,
        num_sparse=spec.num_sparse,
        bot_mlp=spec.bot_mlp,
        top_mlp=spec.top_mlp,
        seed=spec.seed,
        dtype=dtype,
    )
    model.load_state_dict(bundle.dense)
    model.eval()
    scores, labels = [], []
    with torch.no_grad():
        for batch in eval_batches(dataset, args.batch_size, count):
            logits = model(torch.from_numpy(batch.dense).to(dtype), torch.from_numpy(batch.keys))
            scores.append(logits.double().numpy())
            labels.append(batch.labels.astype(np.float64))
    if not scores:
        raise BundleError("the data has no evaluation batches")
    result = evaluate(np.concatenate(scores), np.concatenate(labels))
    samples = sum(len(x) for x in labels)
    return {
        "eval_auc": result["auc"],
        "eval_logloss": result["logloss"],
        "eval_samples": samples,
        "steps": bundle.steps,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        print(json.dumps(score(args)), flush=True)
    except (BundleError, ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
