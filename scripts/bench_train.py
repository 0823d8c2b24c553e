#!/usr/bin/env python
"""Training throughput: cpu_dist under mpirun against a single-process PyTorch loop, one run.

Default DLRM (global batch 2048, D=64, 26 sparse features, synthetic data).  Runs, in order:
  torch      single process, nn.EmbeddingBag(sparse=True) + torch.optim.SGD, same model and data
  w1         cpu_dist, 1 worker + 1 PS shard (pipelined commits, ps aggregation)
  w2_ps      2 workers + 1 PS, pipelined commit protocol, ps aggregation
  w2_coll    2 workers + 1 PS, pipelined commit protocol, collective aggregation
  w2_barrier 2 workers + 1 PS, every step waits for its commit (the simple barrier path)
The last line is one JSON object: samples/s of each, phase seconds per step, and the ratios
ratio_w1 (w1 / torch), commit_speedup (w2_ps / w2_barrier) and exposed_sparse_ratio (seconds
per step workers wait on sparse traffic: pulls, commit waits and, in collective mode, the
row exchange; w2_ps / w2_barrier), and ps_apply_ms_<run> (the shard's mean wall time to apply
one step's commit: the part of a commit wait that is the shard's own work).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cpu_dist.common.contracts import TABLE  # noqa: E402
from cpu_dist.common.features import CATEGORICAL_FEATURES  # noqa: E402
from cpu_dist.common.validate import mlp_widths  # noqa: E402
from cpu_dist.data import make_dataset, train_batches  # noqa: E402
from cpu_dist.embeddings import EmbeddingBagConfig  # noqa: E402
from cpu_dist.models.dlrm import DLRM  # noqa: E402
from cpu_dist.models.factory import build_model  # noqa: E402
from cpu_dist.testing.jobs import measured_flags, run_job  # noqa: E402
from cpu_dist.train.metrics import read_summary  # noqa: E402


class TorchDLRM(torch.nn.Module):
    """The comparison: the same DLRM's dense layers (the built-in ``dlrm``, same seeded init)
    over one plain nn.EmbeddingBag of the whole fused key space with sparse gradients, fed
    the batch's keys ``[B, F]`` directly (the cheapest torch formulation)."""

    def __init__(self, dlrm: DLRM, num_rows: int, dim: int) -> None:
        super().__init__()
        self.dlrm = dlrm
        self.bag = torch.nn.EmbeddingBag(num_rows, dim, mode="sum", sparse=True)

    def forward(self, dense: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        b, f = keys.shape
        bottom = self.dlrm.bot(dense)
        emb = self.bag(keys.reshape(-1, 1)).view(b, f, -1)
        return self.dlrm.top(self.dlrm.interact(bottom, emb)).squeeze(-1)


def run_torch(args) -> dict:
    ds = make_dataset("synthetic", seed=0)
    tables = [EmbeddingBagConfig(0, args.dim, TABLE, feature_names=CATEGORICAL_FEATURES)]
    dense = build_model(
        "dlrm",
        tables,
        ds.num_dense,
        {
            "bot_mlp": list(mlp_widths(args.bot, "bot")),
            "top_mlp": list(mlp_widths(args.top, "top")),
        },
        seed=0,
    )
    model = TorchDLRM(dense, ds.num_keys, args.dim)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    batches = train_batches(ds, args.batch_size)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        _, b = next(batches)
        opt.zero_grad()
        loss = loss_fn(
            model(torch.from_numpy(b.dense), torch.from_numpy(b.keys)), torch.from_numpy(b.labels)
        )
        loss.backward()
        opt.step()
    secs = time.perf_counter() - t0
    return {"samples_per_s": args.steps * args.batch_size / secs, "seconds": secs}


def run_ours(args, name: str, workers: int, extra: list[str]) -> dict:
    out = Path(tempfile.mkdtemp()) / f"{name}.jsonl"
    model = [
        "--embedding-dim",
        str(args.dim),
        "--arch-mlp-bot",
        args.bot,
        "--arch-mlp-top",
        args.top,
    ]
    flags = [*measured_flags(args.batch_size, args.steps, out), *model, "--lr", str(args.lr)]
    run_job(name, workers + 1, ["--worker-num", str(workers), *flags, *extra], timeout_s=1800)
    summary = read_summary(out)
    steps = summary["steps"]
    per_step = {k[2:]: v / steps for k, v in summary.items() if k.startswith("t_")}
    return {
        "samples_per_s": summary["samples_per_s"],
        "seconds": summary["seconds"],
        "phase_s_per_step": per_step,
        # pull + every wait on a commit (acks and application) + collective row exchange
        "exposed_sparse_s_per_step": summary["exposed_sparse_s"] / steps,
        "commit_wait_s_per_step": summary["commit_wait_s"] / steps,
        "bytes_pulled_per_step": summary["bytes_pulled"] / steps,
        "bytes_pushed_per_step": summary["bytes_pushed"] / steps,
        "ps_apply_ms": summary.get("ps_apply_ms"),  # absent where nothing went through commits
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--bot", default="512-256-64")
    p.add_argument("--top", default="512-256-1")
    p.add_argument("--lr", type=float, default=0.1)
    args = p.parse_args()
    res = {"torch": run_torch(args)}
    print("torch", json.dumps(res["torch"]), flush=True)
    for name, workers, extra in [
        ("w1", 1, []),
        ("w2_ps", 2, []),
        ("w2_coll", 2, ["--aggregation", "collective"]),
        ("w2_barrier", 2, ["--sparse-sync", "barrier"]),
    ]:
        res[name] = run_ours(args, name, workers, extra)
        print(name, json.dumps(res[name]), flush=True)
    sps = {k: v["samples_per_s"] for k, v in res.items()}
    line = {f"samples_per_s_{k}": round(v, 1) for k, v in sps.items()}
    line["ratio_w1"] = round(sps["w1"] / sps["torch"], 3)
    line["ratio_w2"] = round(sps["w2_ps"] / sps["torch"], 3)
    line["commit_speedup"] = round(sps["w2_ps"] / sps["w2_barrier"], 3)
    line["exposed_sparse_ratio"] = round(
        res["w2_ps"]["exposed_sparse_s_per_step"]
        / max(res["w2_barrier"]["exposed_sparse_s_per_step"], 1e-9),
        3,
    )
    for k in ("w2_ps", "w2_coll", "w2_barrier"):
        line[f"commit_wait_ms_{k}"] = round(1e3 * res[k]["commit_wait_s_per_step"], 2)
        line[f"exposed_sparse_ms_{k}"] = round(1e3 * res[k]["exposed_sparse_s_per_step"], 2)
        if res[k]["ps_apply_ms"] is not None:
            line[f"ps_apply_ms_{k}"] = round(res[k]["ps_apply_ms"], 2)
    line["phase_ms_per_step_w1"] = {
        k: round(1e3 * v, 2) for k, v in res["w1"]["phase_s_per_step"].items()
    }
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
