"""``python -m cpu_dist.serving BUNDLE_DIR [data flags] --eval-batches N``: score an exported
model on the evaluation batches a training job with the same data flags scores, and print one
JSON line with ``eval_auc`` and ``eval_logloss``.  Needs neither MPI nor a parameter server
nor the native module."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from cpu_dist.common.config import TrainConfig
from cpu_dist.common.flags import add_data_flags
from cpu_dist.common.validate import ConfigError, data_config
from cpu_dist.data import dataset_for, eval_batches
from cpu_dist.models.dlrm import build_dlrm
from cpu_dist.models.scoring import evaluate
from cpu_dist.serving.bundle import BundleError, open_bundle
from cpu_dist.serving.embedding import BundleEmbedding


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m cpu_dist.serving", description=__doc__)
    ap.add_argument("bundle", help="directory written by --export or python -m cpu_dist.export")
    add_data_flags(ap)
    ap.add_argument(
        "--seed", type=int, default=None, help="the job's --seed (default: the bundle's)"
    )
    ap.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
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


def score(args: argparse.Namespace) -> dict[str, float]:
    bundle = open_bundle(args.bundle, check=not args.no_check)
    spec = bundle.spec
    if args.eval_batches == 0 or args.eval_batches < -1 or args.batch_size <= 0:
        raise ConfigError(
            f"--eval-batches {args.eval_batches}, --batch-size {args.batch_size}: need -1 "
            "(all) or a positive number of batches, and a positive batch size"
        )
    seed = spec.seed if args.seed is None else args.seed
    dataset = dataset_for(data_config(args), seed)
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
        "step": bundle.step,
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
