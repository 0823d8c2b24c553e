"""``python -m cpu_dist.reference [the job's flags and job file]``: train the job's model in one
process on the job's global batches (:mod:`cpu_dist.reference`) and write what the job writes:
``--dump-state`` in the job's layout and, with ``--metrics-out``, one JSON summary line.
The flags are the launcher's (``--worker-num`` and the PS flags are accepted and ignored: the
reference has neither), so a job's command line checks against it as it is."""

from __future__ import annotations

import dataclasses
import json
import secrets
import sys
from collections.abc import Sequence

import numpy as np

from cpu_dist.common.flags import parse_args
from cpu_dist.common.parquet_schema import ParquetError
from cpu_dist.common.process_exit import skip_exit_collection
from cpu_dist.common.validate import ConfigError, validate
from cpu_dist.data import eval_batches, train_batches
from cpu_dist.data.run_length import run_length
from cpu_dist.models.factory import ModelError
from cpu_dist.models.scoring import evaluate
from cpu_dist.reference import ReferenceTrainer
from cpu_dist.train.dump import write_dump
from cpu_dist.train.metrics import append_record


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _run(argv)
    except (ModelError, ParquetError) as exc:  # met while training: a model's output, bad data
        print(f"cpu_dist.reference: error: {exc}", file=sys.stderr, flush=True)
        return 2


def _run(argv: Sequence[str] | None) -> int:
    args = parse_args(argv)
    args.ps_list, args.token_file = None, None  # no shards here
    workers = args.worker_num or 1
    try:
        cfg = validate(args, workers + 1)
        trainer = ReferenceTrainer(cfg)
        steps = run_length(cfg.train, cfg.data, trainer.dataset).steps
    except (ConfigError, ModelError, ValueError, OSError) as exc:
        print(f"cpu_dist.reference: error: {exc}", file=sys.stderr, flush=True)
        return 2
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_step=steps))
    loss = float("nan")
    for step, batch in train_batches(trainer.dataset, cfg.train.batch_size):
        if step >= steps:
            break
        loss = trainer.step(batch)
    summary: dict[str, object] = {"steps": trainer.t, "loss": loss}
    out = cfg.output
    if out.final_eval_batches != 0:
        scores, labels = [], []
        for batch in eval_batches(trainer.dataset, cfg.train.batch_size, out.final_eval_batches):
            scores.append(trainer.predict(batch))
            labels.append(batch.labels.astype(np.float64))
        if scores:
            result = evaluate(np.concatenate(scores), np.concatenate(labels))
            summary.update({f"eval_{k}": v for k, v in result.items()})
            summary["eval_samples"] = int(sum(len(x) for x in labels))
    if out.dump_state:
        write_dump(out.dump_state, trainer.dump())
    if out.metrics_out:
        append_record(out.metrics_out, {"summary": summary}, run_id=secrets.token_hex(8))
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    skip_exit_collection()
    sys.exit(code)
