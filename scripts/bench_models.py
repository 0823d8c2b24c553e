#!/usr/bin/env python
"""The DCN-v2 benchmark: MLPerf's DLRM-DCNv2 shape, scaled to this machine, from Parquet.

26 tables (one per Criteo feature), MLPerf's multi-hot bag sizes (214 ids a sample),
MLPerf's cardinalities capped at ``--max-rows``, the ``dcnv2`` model (bottom MLP, low-rank
cross network, top MLP), read from a Parquet file this script writes (NVTabular's layout:
``list<int64>`` columns for the multi-hot features).  Runs, in one process tree, one after
the other on the same file, model, batch and threads:

  torch     one PyTorch process: the same dcnv2 dense layers over one local
            nn.EmbeddingBag(sparse=True) per table, torch.optim.SGD for both (sparse
            gradients); batches decoded before the clock starts (the cheapest loop)
  torchrec  one process: TorchRec's FusedEmbeddingBagCollection (FBGEMM's fused CPU
            kernels, the optimizer fused into the backward), the same dense layers and SGD;
            TorchRec and fbgemm-gpu-cpu are installed into build/torchrec (beside our torch,
            whose version they must match); null in the JSON, with why, where they cannot be
  w1        cpu_dist: ``mpirun -np 2`` launcher.py, 1 worker + 1 PS shard, --data parquet

Every table is SGD (the one optimizer all three run exactly alike).  The last line is one
JSON object: ``samples_per_s_*``, ``ratio_w1_vs_torch``, ``ratio_w1_vs_torchrec``,
``data_share`` (our data phase's seconds over the run's, from the summary), the shape
(widths, cross layers and rank, cardinalities, bag sizes) and our phases per step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cpu_dist.common.data_checks import MLPERF_SIZES  # noqa: E402

# MLPerf DLRM-DCNv2's table sizes (Criteo 1TB, its 40M cap), feature by feature.
MLPERF_ROWS = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip
TORCHREC = ("torchrec==1.8.0", "fbgemm-gpu-cpu==1.8.0")  # the pair built for torch 2.13
TORCHREC_DEPS = (
    "tensordict==0.10.0", "pyre-extensions", "typing-inspect", "mypy-extensions",
    "torchmetrics==1.0.3", "lightning-utilities", "orjson", "pyvers",
)  # fmt: skip
TORCHREC_DIR = ROOT / "build" / "torchrec"


def write_data(path: Path, rows: int, cards: list[int], dim_dense: int, seed: int) -> None:
    """``rows`` samples: ids skewed towards low ids (a power law, as real ids are), MLPerf's
    bag sizes, 13 dense floats and a label that depends on both (so training learns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    columns: dict[str, object] = {}
    dense = rng.standard_normal((rows, dim_dense)).astype(np.float32)
    logit = dense[:, 0] - 0.5 * dense[:, 1]
    for f, (card, size) in enumerate(zip(cards, MLPERF_SIZES)):
        ids = np.minimum((card * rng.random(rows * size) ** 3).astype(np.int64), card - 1)
        if f < 4:
            logit += np.where(ids.reshape(rows, size)[:, 0] % 2 == 0, 0.5, -0.5)
        if size == 1:
            columns[f"cat_{f}"] = pa.array(ids)
        else:
            offsets = pa.array(np.arange(0, rows * size + 1, size, dtype=np.int32))
            columns[f"cat_{f}"] = pa.ListArray.from_arrays(offsets, pa.array(ids))
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int8)
    table = pa.table(
        {
            "label": pa.array(label),
            **{f"int_{j}": pa.array(dense[:, j]) for j in range(dim_dense)},
            **columns,
        }
    )
    pq.write_table(table, path, row_group_size=65536)


def job_file(path: Path, args, cards: list[int]) -> None:
    lines = [
        "[model]",
        'name = "dcnv2"',
        f"bot_mlp = [{args.bot.replace('-', ', ')}]",
        f"top_mlp = [{args.top.replace('-', ', ')}]",
        f"num_layers = {args.dcn_layers}",
        f"low_rank_dim = {args.low_rank}",
        "",
        "[data]",
        'kind = "parquet"',
    ]
    for f, card in enumerate(cards):
        lines += [
            "",
            "[[tables]]",
            f'name = "t_cat_{f}"',
            f"dim = {args.dim}",
            f'features = ["cat_{f}"]',
            f"num_embeddings = {card}",
            'optimizer = "sgd"',
        ]
    path.write_text("\n".join(lines) + "\n")


def run_ours(args, job: Path, data: Path) -> dict:
    from cpu_dist.testing.jobs import measured_flags, run_job
    from cpu_dist.train.metrics import read_summary

    out = Path(tempfile.mkdtemp()) / "w1.jsonl"
    flags = [
        *measured_flags(args.batch_size, args.steps, out),
        *("--config", str(job), "--data-path", str(data), "--worker-num", "1"),
        *("--lr", str(args.lr), "--sparse-lr", str(args.lr), "--dense-optimizer", "sgd"),
    ]
    run_job("w1", 2, flags, timeout_s=1800)
    s = read_summary(out)
    steps = s["steps"]
    return {
        "samples_per_s": s["samples_per_s"],
        "seconds": s["seconds"],
        "data_share": s["t_data"] / s["seconds"],
        "phase_ms_per_step": {
            k[2:]: round(1e3 * v / steps, 2) for k, v in s.items() if k.startswith("t_")
        },
    }


def baseline(kind: str, args, job: Path, data: Path) -> dict:
    """``torch`` or ``torchrec`` in this process (see the module docstring)."""
    import torch

    from cpu_dist.common.flags import parse_args
    from cpu_dist.common.validate import validate
    from cpu_dist.data.factory import dataset_for
    from cpu_dist.data.features import BatchFeatures
    from cpu_dist.train.job_model import build_job_model

    cfg = validate(
        parse_args(["--config", str(job), "--data-path", str(data), "--batch-size",
                    str(args.batch_size), "--worker-num", "1"]),
        2,
    )  # fmt: skip
    dataset = dataset_for(cfg.data, cfg.train.seed)
    features = BatchFeatures(cfg.tables, dataset.kind)
    torch.manual_seed(cfg.train.seed)
    model = build_job_model(cfg, dataset.num_dense)
    tables = [(t.name, t.features[0], int(t.num_embeddings)) for t in cfg.tables.tables]
    batches = []
    for step, batch in dataset.train_batches(args.batch_size):
        if step >= args.steps:
            break
        kjt = features(batch)
        batches.append((torch.from_numpy(batch.dense), kjt, torch.from_numpy(batch.labels.copy())))
    if kind == "torch":
        sparse = LocalBags(tables, args.dim)
        sparse_opt = torch.optim.SGD(sparse.parameters(), lr=args.lr)
        inputs = [(d, sparse.inputs(kjt), y) for d, kjt, y in batches]
    else:
        sparse = torchrec_bags(tables, args.dim, args.lr)
        sparse_opt = None
        inputs = [(d, torchrec_kjt(kjt), y) for d, kjt, y in batches]
    model.sparse_arch = sparse
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("sparse_arch")]
    dense_opt = torch.optim.SGD(dense_params, lr=args.lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    t0 = time.perf_counter()
    for dense, sparse_in, labels in inputs:
        dense_opt.zero_grad()
        if sparse_opt is not None:
            sparse_opt.zero_grad()
        loss = loss_fn(model(dense, sparse_in), labels)
        loss.backward()
        dense_opt.step()
        if sparse_opt is not None:
            sparse_opt.step()
    secs = time.perf_counter() - t0
    return {
        "samples_per_s": len(inputs) * args.batch_size / secs,
        "seconds": secs,
        "loss": float(loss),
        "threads": torch.get_num_threads(),
    }


class _Pooled:
    """What the dcnv2 model reads of its sparse part's output: ``values()`` [B, sum D]."""

    def __init__(self, values) -> None:
        self._values = values

    def values(self):
        return self._values


def _local_bags_module():
    import torch

    class LocalBags(torch.nn.Module):
        """One nn.EmbeddingBag(sparse=True) per table, fed each feature's (values, offsets)."""

        def __init__(self, tables, dim: int) -> None:
            super().__init__()
            self.names = [f for _, f, _ in tables]
            self.bags = torch.nn.ModuleList(
                torch.nn.EmbeddingBag(n, dim, mode="sum", sparse=True) for _, _, n in tables
            )
            for b in self.bags:
                torch.nn.init.uniform_(b.weight, -0.05, 0.05)

        def inputs(self, kjt):
            parts = kjt.to_dict()
            return [
                (parts[f].values(), torch.cat([parts[f].lengths().new_zeros(1),
                                               parts[f].lengths().cumsum(0)[:-1]]))
                for f in self.names
            ]  # fmt: skip

        def forward(self, inputs):
            return _Pooled(torch.cat([b(v, o) for b, (v, o) in zip(self.bags, inputs)], dim=1))

    return LocalBags


def LocalBags(tables, dim):
    return _local_bags_module()(tables, dim)


def torchrec_bags(tables, dim: int, lr: float):
    import torch
    from torchrec import EmbeddingBagConfig
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    configs = [
        EmbeddingBagConfig(name=name, embedding_dim=dim, num_embeddings=n, feature_names=[f])
        for name, f, n in tables
    ]
    return FusedEmbeddingBagCollection(
        tables=configs,
        optimizer_type=torch.optim.SGD,
        optimizer_kwargs={"lr": lr},
        device=torch.device("cpu"),
    )


def torchrec_kjt(kjt):
    from torchrec import KeyedJaggedTensor

    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(kjt.keys()), values=kjt.values(), lengths=kjt.lengths()
    )


def install_torchrec() -> str | None:
    """TorchRec and FBGEMM's CPU build into build/torchrec (once); None, or why not."""
    marker = TORCHREC_DIR / ".installed"
    if not marker.exists():
        TORCHREC_DIR.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
               str(TORCHREC_DIR), *TORCHREC, *TORCHREC_DEPS]  # fmt: skip
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            return "pip install timed out after 900 s"
        if done.returncode != 0:
            return f"pip install {' '.join(TORCHREC)} failed: {done.stderr.strip()[-300:]}"
        marker.write_text(" ".join(TORCHREC) + "\n")
    check = subprocess.run(
        [sys.executable, "-c", "import torchrec, fbgemm_gpu, torch; "
         "torch.ops.fbgemm.asynchronous_complete_cumsum(torch.tensor([1]))"],
        env={**os.environ, "PYTHONPATH": f"{TORCHREC_DIR}:{ROOT}"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if check.returncode != 0:
        return f"torchrec does not load beside our torch: {check.stderr.strip()[-300:]}"
    return None


def run_baseline_process(kind: str, argv: list[str]) -> dict:
    """A baseline in a process of its own (TorchRec's packages on its path alone)."""
    env = dict(os.environ)
    if kind == "torchrec":
        env["PYTHONPATH"] = f"{TORCHREC_DIR}:{ROOT}"
    done = subprocess.run(
        [sys.executable, __file__, *argv, "--baseline", kind],
        env=env, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{kind} failed ({done.returncode}): {done.stderr.strip()[-600:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--bot", default="128-64-16")
    p.add_argument("--top", default="256-128-1")
    p.add_argument("--dcn-layers", type=int, default=3)
    p.add_argument("--low-rank", type=int, default=64)
    p.add_argument("--max-rows", type=int, default=200_000, help="cap on every table's rows")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None, help="where the data and job file go")
    p.add_argument("--skip-torchrec", action="store_true")
    p.add_argument("--baseline", choices=["torch", "torchrec"], help=argparse.SUPPRESS)
    args = p.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_models."))
    work.mkdir(parents=True, exist_ok=True)
    cards = [min(n, args.max_rows) for n in MLPERF_ROWS]
    data, job = work / "mlperf.parquet", work / "job.toml"
    if args.baseline:  # the child: data and job file are there
        print(json.dumps(baseline(args.baseline, args, job, data)), flush=True)
        return
    rows = int(args.steps * args.batch_size / 0.9) + 2 * args.batch_size
    t0 = time.perf_counter()
    write_data(data, rows, cards, 13, args.seed)
    job_file(job, args, cards)
    print(f"data: {rows} rows, {data.stat().st_size / 2**20:.1f} MiB in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
    argv = [a for a in sys.argv[1:] if a != "--skip-torchrec"]
    if args.workdir is None:
        argv += ["--workdir", str(work)]
    res: dict[str, dict | None] = {"torch": run_baseline_process("torch", argv)}
    print("torch", json.dumps(res["torch"]), flush=True)
    why = "skipped (--skip-torchrec)" if args.skip_torchrec else install_torchrec()
    if why is None:
        try:
            res["torchrec"] = run_baseline_process("torchrec", argv)
        except RuntimeError as exc:
            why = str(exc)
    if why is not None:
        res["torchrec"] = None
    print("torchrec", json.dumps(res["torchrec"]) if why is None else why, flush=True)
    res["w1"] = run_ours(args, job, data)
    print("w1", json.dumps(res["w1"]), flush=True)
    w1 = res["w1"]["samples_per_s"]
    line = {
        **{
            f"samples_per_s_{k}": (round(v["samples_per_s"], 1) if v else None)
            for k, v in res.items()
        },
        "ratio_w1_vs_torch": round(w1 / res["torch"]["samples_per_s"], 3),  # type: ignore[index]
        "ratio_w1_vs_torchrec": (
            round(w1 / res["torchrec"]["samples_per_s"], 3) if res["torchrec"] else None
        ),
        "torchrec_why_null": why,
        "data_share": round(res["w1"]["data_share"], 4),
        "shape": {
            "tables": len(cards),
            "dim": args.dim,
            "bot_mlp": args.bot,
            "top_mlp": args.top,
            "dcn_layers": args.dcn_layers,
            "low_rank": args.low_rank,
            "num_embeddings": cards,
            "multi_hot_sizes": list(MLPERF_SIZES),
            "ids_per_sample": sum(MLPERF_SIZES),
            "batch_size": args.batch_size,
            "steps": args.steps,
        },
        "threads_torch": res["torch"]["threads"],  # type: ignore[index]
        "phase_ms_per_step_w1": res["w1"]["phase_ms_per_step"],
    }
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
