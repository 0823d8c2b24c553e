"""Command-line flags of launcher.py and the checks that run before any training.

Flag names follow the first designs (``--worker_num``, ``--ps_list``, ``--max_step``) and DLRM's
reference conventions (``--arch-mlp-bot``); both spellings are accepted where they differ.
Every rank parses and validates the same argv, so every rank reaches the same verdict without
communicating, and rank 0 alone prints it.  ``cpu_dist.common.validate`` turns them into
the typed :class:`~cpu_dist.common.config.Config`; defaults come from its dataclasses.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from cpu_dist.common.config import (
    BUILTIN_MODEL_NAMES,
    CacheConfig,
    CheckpointConfig,
    ClientConfig,
    JobConfig,
    ModelConfig,
    OutputConfig,
    ShardStorageConfig,
    TrainConfig,
)
from cpu_dist.common.data_flags import add_data_flags
from cpu_dist.common.dense_optimizer import DENSE_OPTIMIZERS
from cpu_dist.common.first_rank import FirstRankParser
from cpu_dist.common.job_file import JobFileError, apply_job_defaults
from cpu_dist.common.tables import OPTIMIZERS


def _add_job_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("job layout")
    g.add_argument(
        "--config",
        default=None,
        metavar="JOB.toml",
        help="job file: the job's [[tables]], [model] (name = --model, the other keys its "
        "arguments), [data] (kind = --data, bags, weights) and any other flag in [job] (with "
        "underscores: batch_size = 4096); a flag on the command line beats the file",
    )
    g.add_argument(
        "--worker-num",
        "--worker_num",
        dest="worker_num",
        type=int,
        default=None,
        help="ranks 0..W-1 are workers, the rest PS shards (default: all but one "
        "rank; all ranks with --ps_list and no PS ranks)",
    )
    g.add_argument(
        "--ps-list",
        "--ps_list",
        dest="ps_list",
        default=None,
        help="host:port,...: with PS ranks in the job, PS rank i listens on the i-th "
        "address; with no PS ranks, the workers use shards started elsewhere",
    )
    g.add_argument(
        "--ps-host",
        default=None,
        help="address PS ranks listen on and publish (default: 127.0.0.1 when the job is "
        "on one node, else the address that routes to the other ranks' hosts)",
    )
    g.add_argument(
        "--ps-interface",
        default=None,
        help="publish and listen on this network interface's address (instead of the "
        "address that routes to the other ranks' hosts)",
    )
    g.add_argument(
        "--token-file",
        default=None,
        help="job token of external --ps_list shards (else $CPU_DIST_TOKEN)",
    )
    g.add_argument(
        "--ps-type",
        default=JobConfig.ps_type,
        choices=["local", "grpc", "RDMA", "rdma"],
        help="sparse transport; RDMA selects the local gRPC backend on one node",
    )
    g.add_argument(
        "--reuse-shard-rows",
        action="store_true",
        help="train on the rows external --ps_list shards already hold (without it, shards "
        "that hold rows stop the job unless --resume restores a checkpoint over them)",
    )
    g.add_argument(
        "--session-idle-timeout",
        type=float,
        default=JobConfig.session_idle_timeout_s,
        help="PS ranks of this job close commit sessions idle this many seconds (0: never)",
    )
    g.add_argument(
        "--barrier-timeout",
        type=float,
        default=JobConfig.barrier_timeout_s,
        help="seconds ranks wait for each other (start-up, a step, a commit that needs "
        "every worker, an evaluation, the end of the job); checkpoints add "
        "--checkpoint-timeout",
    )
    g.add_argument(
        "--worker-nice",
        type=int,
        default=JobConfig.worker_nice,
        help="workers that share a node with a PS rank run this much nicer than it, so that "
        "the shard's short commits and reads are not queued behind their compute (0: off)",
    )
    g.add_argument(
        "--worker-threads",
        type=int,
        default=JobConfig.worker_threads,
        metavar="N",
        help="torch threads of each worker (0: OMP_NUM_THREADS when set, else an equal share of "
        "its node's cores among the node's workers)",
    )


def _add_client_flags(p: argparse.ArgumentParser) -> None:
    c = p.add_argument_group("PS client")
    c.add_argument("--ps-max-keys-per-rpc", type=int, default=ClientConfig.max_keys_per_rpc)
    c.add_argument(
        "--ps-channels", type=int, default=ClientConfig.channels, help="connections per PS shard"
    )
    c.add_argument(
        "--ps-max-message-bytes",
        type=int,
        default=ClientConfig.max_message_bytes,
        help="largest gRPC message a shard or client accepts",
    )
    c.add_argument(
        "--ps-compression",
        default=ClientConfig.compression,
        choices=["none", "fp16", "int8"],
        help="encoding of pulled rows and pushed gradients on the wire (int8: a float32 scale "
        "per row and one byte per value); the PS keeps and updates float32 rows",
    )
    c.add_argument(
        "--rpc-timeout",
        type=float,
        default=ClientConfig.rpc_timeout_s,
        help="seconds one PS call may take",
    )


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("model")
    m.add_argument(
        "--model",
        default=ModelConfig.name,
        metavar="NAME",
        help=f"the model: built-in {' or '.join(BUILTIN_MODEL_NAMES)}, or the user's factory "
        "PKG.MODULE:FUNC or path/to/file.py:FUNC, called as FUNC(tables, dense_features, "
        "**args) -> nn.Module; a job file's [model] name, its other [model] keys the args",
    )
    m.add_argument("--embedding-dim", type=int, default=ModelConfig.embedding_dim)
    m.add_argument(
        "--arch-mlp-bot",
        default=None,
        help="bottom MLP widths, ending in --embedding-dim (default 512-256-D)",
    )
    m.add_argument("--arch-mlp-top", default="512-256-1", help="top MLP widths, ending in 1")
    m.add_argument(
        "--dtype",
        default=ModelConfig.dtype,
        choices=["float32", "float64"],
        help="dense parameter dtype (embedding rows are always float32)",
    )
    m.add_argument(
        "--init-scale",
        type=float,
        default=None,
        help="first-touch rows are uniform in [-s, s) (default 1/sqrt(dim))",
    )
    m.add_argument(
        "--dcn-num-layers",
        "--dcn_num_layers",
        dest="dcn_num_layers",
        type=int,
        default=ModelConfig.dcn_num_layers,
        metavar="N",
        help="--model dcnv2: layers of the low-rank cross network (TorchRec dlrm_main's "
        "--dcn_num_layers)",
    )
    m.add_argument(
        "--dcn-low-rank-dim",
        "--dcn_low_rank_dim",
        dest="dcn_low_rank_dim",
        type=int,
        default=ModelConfig.dcn_low_rank_dim,
        metavar="N",
        help="--model dcnv2: rank of each cross layer's weight, W = U V (TorchRec dlrm_main's "
        "--dcn_low_rank_dim)",
    )


def _add_train_flags(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("training")
    t.add_argument(
        "--batch-size", type=int, default=TrainConfig.batch_size, help="global batch size"
    )
    t.add_argument(
        "--max_step",
        "--max-step",
        dest="max_step",
        type=int,
        default=None,
        help=f"training steps (default: {TrainConfig.max_step} on synthetic data; file data "
        "trains --epochs passes, one by default)",
    )
    t.add_argument("--lr", type=float, default=TrainConfig.lr)
    t.add_argument("--sparse-lr", type=float, default=None, help="default: --lr")
    for flag, kind, help_ in (
        ("--lr-warmup-steps", int, "linear warmup of every rate over the first N steps"),
        ("--lr-decay-start", int, "the step count at which the polynomial decay starts"),
        ("--lr-decay-steps", int, "the decay's length in steps (0: no decay)"),
        ("--lr-decay-power", float, "the decay's exponent (MLPerf's 2)"),
        ("--lr-min", float, "the floor of every decayed rate (MLPerf's 1e-7)"),
    ):
        dest = flag[2:].replace("-", "_")
        t.add_argument(flag, type=kind, default=getattr(TrainConfig, dest), help=help_)
    t.add_argument(
        "--dense-optimizer",
        default=TrainConfig.dense_optimizer,
        choices=list(DENSE_OPTIMIZERS),
        help="torch.optim's optimizer of the dense parameters; with a job file, [optimizer] name",
    )
    settings: tuple[tuple[str, type, str, str], ...] = (
        (
            "--weight-decay",
            float,
            "WD",
            "the dense optimizer's weight decay (torch's default: adamw 0.01, else 0)",
        ),
        ("--betas", str, "B1,B2", "dense adam and adamw: betas (torch's default: 0.9,0.999)"),
        ("--momentum", float, "M", "dense sgd: momentum (torch's default: 0)"),
        (
            "--eps",
            float,
            "EPS",
            "dense adam, adamw, adagrad: eps (torch's default: 1e-8; adagrad 1e-10)",
        ),
    )
    for name, convert, metavar, text in settings:  # None: torch's default; [optimizer] key
        t.add_argument(name, type=convert, default=None, metavar=metavar, help=text)
    t.add_argument(
        "--sparse-optimizer",
        default=TrainConfig.sparse_optimizer,
        choices=list(OPTIMIZERS),
        help="the table optimizer (adagrad: element-wise, with each table's eps); with a job "
        "file, the default of tables that name none",
    )
    t.add_argument("--seed", type=int, default=TrainConfig.seed)
    t.add_argument(
        "--aggregation",
        "--bagpipe-aggregation",
        dest="aggregation",
        default=TrainConfig.aggregation,
        choices=["ps", "collective"],
        help="who sums a step's sparse gradients: the PS, or an MPI all-reduce",
    )
    t.add_argument(
        "--dense-sync",
        default=TrainConfig.dense_sync,
        choices=["allreduce", "reduce_scatter"],
        help="allreduce: every worker updates every dense parameter; reduce_scatter: "
        "gradients reduce-scattered, each worker updates (and keeps the optimizer state of) "
        "1/W of the parameters, which are then all-gathered (ZeRO stage 1)",
    )
    t.add_argument(
        "--sparse-sync",
        default=TrainConfig.sparse_sync,
        choices=["pipelined", "barrier", "async"],
        help="pipelined: the next pull waits only for the commit it reads (under collective "
        "aggregation for none: the worker catches its rows up); "
        "barrier: every step waits for its commit before going on; async: a pull waits only "
        "for the commits up to --max-staleness steps back (not bitwise reproducible for K >= 1)",
    )
    t.add_argument(
        "--max-staleness",
        type=int,
        default=TrainConfig.max_staleness,
        metavar="K",
        help="with --sparse-sync async: step t reads rows holding every commit up to t-1-K "
        "(0 = the pipelined mode, bit for bit; at most 63)",
    )


def add_table_flags(
    p: argparse.ArgumentParser,
    title: str = "PS tables (PS ranks of this job; external shards must agree)",
) -> None:
    """How a shard keeps its rows: the launcher's flags for its PS ranks, and the same flags
    of a standalone shard (``python -m cpu_dist.sparse.server``), so both mean one thing."""
    g = p.add_argument_group(title)
    g.add_argument(
        "--ps-memory-rows",
        type=int,
        default=ShardStorageConfig.memory_rows,
        help="rows each shard keeps in DRAM (0: no bound); beyond it rows go to --ps-ssd-dir",
    )
    g.add_argument(
        "--ps-ssd-dir",
        default=None,
        help="directory of each shard's RocksDB tier (working storage, removed at the end)",
    )
    g.add_argument(
        "--ps-admit-after",
        type=int,
        default=ShardStorageConfig.admit_after,
        metavar="N",
        help="a key's gradients are applied from the N-th committed step whose batch holds "
        "it (earlier ones dropped; it reads its first-touch row until then; 0: off)",
    )
    g.add_argument(
        "--ps-expire-after",
        type=int,
        default=ShardStorageConfig.expire_after,
        metavar="S",
        help="when step t commits, rows last updated at t-S or earlier are dropped (0: off)",
    )


def _add_memory_flags(p: argparse.ArgumentParser) -> None:
    """The DRAM budget in bytes, across every table of a shard (the launcher's PS ranks)."""
    g = p.add_argument_group("PS memory")
    g.add_argument(
        "--ps-memory-bytes",
        type=int,
        default=ShardStorageConfig.memory_bytes,
        metavar="BYTES",
        help="DRAM each PS rank's shard keeps for rows, across all its tables (values, "
        "optimizer state, key and per-row metadata; 0: no bound); beyond it rows go to "
        "--ps-ssd-dir",
    )


def _add_cache_flags(p: argparse.ArgumentParser) -> None:
    c = p.add_argument_group("cache stage (gpu_cache)")
    c.add_argument(
        "--read-mode",
        default="direct",
        choices=["direct", "bagpipe"],
        help="bagpipe: a bounded embedding cache on each worker in front of the PS",
    )
    c.add_argument(
        "--optimization-prescan",
        action="store_true",
        help="build access plans from the whole id trace before training "
        "(else workers exchange batch ids every step)",
    )
    c.add_argument(
        "--optimization-cache-capacity",
        type=int,
        default=CacheConfig.capacity_units,
        help="cache size in units of 64 rows",
    )
    c.add_argument(
        "--optimization-plan-window",
        type=int,
        default=CacheConfig.plan_window,
        help="prescan: steps ahead a row's next use is looked up (0: all)",
    )
    c.add_argument(
        "--optimization-bypass-below",
        type=float,
        metavar="H",
        default=CacheConfig.bypass_below,
        help="low-hit bypass: when the hit rate of the last 8 admitting reads "
        "is below H, stop admitting misses into the cache (hits are still "
        "served; every 16th read admits and measures again; 0: never)",
    )


def _add_checkpoint_and_output_flags(p: argparse.ArgumentParser) -> None:
    c = p.add_argument_group("checkpoints")
    c.add_argument(
        "--checkpoint-dir",
        default=None,
        help="where checkpoints go (step-NNNNNNNN/ with a manifest, written last)",
    )
    c.add_argument(
        "--checkpoint-every",
        type=int,
        default=CheckpointConfig.every,
        help="checkpoint after every N-th step (0: never)",
    )
    c.add_argument(
        "--checkpoint-keep",
        type=int,
        default=CheckpointConfig.keep,
        help="complete checkpoints kept (0: all)",
    )
    c.add_argument(
        "--checkpoint-timeout",
        type=float,
        default=CheckpointConfig.timeout_s,
        help="seconds one shard may take to save or restore its rows",
    )
    c.add_argument(
        "--resume",
        action="store_true",
        help="start from the newest complete checkpoint in --checkpoint-dir",
    )
    o = p.add_argument_group("output")
    o.add_argument("--metrics-out", default=None, help="JSON lines, one per logged step")
    o.add_argument("--print-freq", type=int, default=OutputConfig.print_freq)
    o.add_argument(
        "--eval-every", type=int, default=OutputConfig.eval_every, help="0: only at the end"
    )
    o.add_argument(
        "--eval-batches",
        type=int,
        default=None,
        help=f"global batches of the eval split each evaluation scores; -1: all of it, the "
        f"last partial batch included (default: {OutputConfig.eval_batches} for the periodic "
        "ones, all for the final one; the endless synthetic stream: 4)",
    )
    o.add_argument(
        "--test-batches",
        type=int,
        default=-1,
        help="global batches of the test split scored once training ends (test_auc, "
        "test_logloss in the summary); -1: all of it (synthetic data: 4), 0: none. Data "
        "without a test split reports none",
    )
    o.add_argument(
        "--dump-state",
        default=None,
        help=".npz at the end: dense/<name>, and per table table/<name>/keys (int64, sorted) "
        "and table/<name>/values (float32 [n, dim])",
    )
    o.add_argument(
        "--export",
        default=None,
        metavar="DIR",
        help="write a serving bundle of the final model to DIR (python -m cpu_dist.serving "
        "scores it)",
    )
    o.add_argument("--tensorboard", default=None, help="TensorBoard log directory")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    o.add_argument(
        "--metric-window",
        type=int,
        default=OutputConfig.metric_window,
        metavar="N",
        help="train_auc and train_ne of each logged step are over the last N steps' rows; 0: none",
    )
    o.add_argument(
        "--metric",
        action="append",
        default=[],
        metavar="MODULE:CLASS",
        help="a torchmetrics.Metric of your own (PKG.MODULE:CLASS or path/to/file.py:CLASS), "
        "computed on every evaluation as eval_<class name in snake case>; repeatable",
    )
    o.add_argument(
        "--verbose-summary",
        action="store_true",
        help="print every figure of the summary at the end, not only the main ones",
    )


def build_parser() -> argparse.ArgumentParser:
    p = FirstRankParser(
        prog="launcher.py",
        description="Train a DLRM across MPI worker ranks and C++ parameter-server ranks.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_job_flags(p)
    _add_client_flags(p)
    add_data_flags(p)
    _add_model_flags(p)
    _add_train_flags(p)
    add_table_flags(p)
    _add_memory_flags(p)
    _add_cache_flags(p)
    _add_checkpoint_and_output_flags(p)
    return p


def given_flags(argv: Sequence[str] | None) -> frozenset[str]:
    """The ``dest`` of every flag the command line names (whatever its value): what a user
    asked for, as opposed to a default."""
    p = build_parser()
    for action in p._actions:
        action.default = argparse.SUPPRESS
    ns, _ = p.parse_known_args(argv)
    return frozenset(vars(ns))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The parsed flags, with ``given`` (the dests the command line named) and ``job_file``
    (the ``--config`` file read, or None) beside them.  A job file's ``[job]`` values are the
    parser's defaults, so the command line beats them; a bad job file ends the parse as a bad
    flag does (one ``launcher.py: error:`` line, exit 2)."""
    p = build_parser()
    try:
        job_file = apply_job_defaults(p, argv)
    except JobFileError as exc:
        p.exit(2, f"{p.prog}: error: {exc}\n")
    args = p.parse_args(argv)
    args.given = given_flags(argv)
    args.job_file = job_file
    return args
