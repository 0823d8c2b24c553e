"""Command-line flags of launcher.py and the checks that run before any training.

Flag names follow the first designs (``--worker_num``, ``--ps_list``, ``--max_step``) and DLRM's
reference conventions (``--arch-mlp-bot``); both spellings are accepted where they differ.
Every rank parses and validates the same argv, so every rank reaches the same verdict without
communicating, and rank 0 alone prints it.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence


class ConfigError(ValueError):
    """A flag or flag combination that cannot work; the message names the flag."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="launcher.py",
        description="Train a DLRM across MPI worker ranks and C++ parameter-server ranks.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    job = p.add_argument_group("job layout")
    job.add_argument(
        "--worker-num",
        "--worker_num",
        dest="worker_num",
        type=int,
        default=None,
        help="ranks 0..W-1 are workers, the rest PS shards (default: all but one "
        "rank, or all ranks with an external --ps_list)",
    )
    job.add_argument(
        "--ps-list",
        "--ps_list",
        dest="ps_list",
        default=None,
        help="host:port,...: with PS ranks in the job, PS rank i listens on the i-th "
        "address; with no PS ranks, the workers use shards started elsewhere",
    )
    job.add_argument(
        "--ps-host",
        default=None,
        help="address PS ranks listen on (default: 127.0.0.1 when the job is on one "
        "node, else this node's hostname address)",
    )
    job.add_argument(
        "--token-file",
        default=None,
        help="job token for an external --ps_list (else $CPU_DIST_TOKEN)",
    )
    job.add_argument("--ps-max-keys-per-rpc", type=int, default=8192)
    job.add_argument("--ps-channels", type=int, default=2, help="connections per PS shard")
    job.add_argument(
        "--ps-max-message-bytes",
        type=int,
        default=64 << 20,
        help="largest gRPC message a shard or client accepts",
    )
    job.add_argument(
        "--rpc-timeout",
        type=float,
        default=60.0,
        help="seconds any single PS call or commit wait may take",
    )
    job.add_argument(
        "--ps-type",
        default="local",
        choices=["local", "grpc", "RDMA", "rdma"],
        help="sparse transport; RDMA selects the local gRPC backend on one node",
    )

    data = p.add_argument_group("data")
    data.add_argument("--data", default="synthetic", choices=["synthetic", "criteo"])
    data.add_argument("--data-path", default=None, help="Criteo TSV file (with --data criteo)")
    data.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="count and skip malformed Criteo lines instead of failing",
    )
    data.add_argument("--zipf-exponent", type=float, default=1.05)

    model = p.add_argument_group("model")
    model.add_argument("--embedding-dim", type=int, default=64)
    model.add_argument("--arch-mlp-bot", default="512-256-64")
    model.add_argument("--arch-mlp-top", default="512-256-1")
    model.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "float64"],
        help="dense parameter dtype (embedding rows are always float32)",
    )
    model.add_argument(
        "--init-scale",
        type=float,
        default=None,
        help="first-touch rows are uniform in [-s, s) (default 1/sqrt(dim))",
    )

    train = p.add_argument_group("training")
    train.add_argument("--batch-size", type=int, default=2048, help="global batch size")
    train.add_argument("--max_step", "--max-step", dest="max_step", type=int, default=300)
    train.add_argument("--lr", type=float, default=0.5)
    train.add_argument("--sparse-lr", type=float, default=None, help="default: --lr")
    train.add_argument("--dense-optimizer", default="sgd", choices=["sgd", "adamw"])
    train.add_argument("--sparse-optimizer", default="sgd", choices=["sgd", "rowwise_adagrad"])
    train.add_argument("--seed", type=int, default=0)
    train.add_argument(
        "--aggregation",
        "--bagpipe-aggregation",
        dest="aggregation",
        default="ps",
        choices=["ps", "collective"],
        help="who sums a step's sparse gradients: the PS, or an MPI all-reduce",
    )
    train.add_argument(
        "--sparse-sync",
        default="pipelined",
        choices=["pipelined", "barrier"],
        help="pipelined: the next pull waits only for the commit it reads; "
        "barrier: every step waits for its commit before going on",
    )

    cache = p.add_argument_group("cache stage (gpu_cache)")
    cache.add_argument(
        "--read-mode",
        default="direct",
        choices=["direct", "bagpipe"],
        help="bagpipe: a bounded embedding cache on each worker in front of the PS",
    )
    cache.add_argument(
        "--optimization-prescan",
        action="store_true",
        help="build access plans from the whole id trace before training "
        "(else workers exchange batch ids every step)",
    )
    cache.add_argument(
        "--optimization-cache-capacity",
        type=int,
        default=8192,
        help="cache size in units of 64 rows",
    )
    cache.add_argument(
        "--optimization-plan-window",
        type=int,
        default=0,
        help="prescan: steps ahead a row's next use is looked up (0: all)",
    )
    cache.add_argument(
        "--optimization-bypass-below",
        type=float,
        default=0.02,
        metavar="H",
        help="low-hit bypass: when the hit rate of the last 8 admitting reads "
        "is below H, stop admitting misses into the cache (hits are still "
        "served; every 16th read admits and measures again; 0: never)",
    )

    ckpt = p.add_argument_group("checkpoints")
    ckpt.add_argument(
        "--checkpoint-dir",
        default=None,
        help="where checkpoints go (step-NNNNNNNN/ with a manifest, written last)",
    )
    ckpt.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="checkpoint after every N-th step (0: never)",
    )
    ckpt.add_argument(
        "--checkpoint-keep", type=int, default=2, help="complete checkpoints kept (0: all)"
    )
    ckpt.add_argument(
        "--resume",
        action="store_true",
        help="start from the newest complete checkpoint in --checkpoint-dir",
    )

    out = p.add_argument_group("output")
    out.add_argument("--metrics-out", default=None, help="JSON lines, one per logged step")
    out.add_argument("--print-freq", type=int, default=10)
    out.add_argument("--eval-every", type=int, default=100, help="0: only at the end")
    out.add_argument("--eval-batches", type=int, default=4)
    out.add_argument(
        "--dump-state",
        default=None,
        help=".npz with dense/<name>, sparse_keys, sparse_values at the end",
    )
    out.add_argument("--tensorboard", default=None, help="TensorBoard log directory")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def mlp_widths(spec: str, flag: str) -> list[int]:
    try:
        widths = [int(x) for x in spec.split("-") if x]
    except ValueError:
        raise ConfigError(
            f"{flag} {spec!r}: expected widths joined by '-', e.g. 512-256-64"
        ) from None
    if not widths or any(w <= 0 for w in widths):
        raise ConfigError(f"{flag} {spec!r}: widths must be positive integers")
    return widths


def validate(args: argparse.Namespace, world_size: int) -> None:
    """Raise ConfigError for any impossible combination; identical on every rank."""
    if args.worker_num is None:
        args.worker_num = world_size if args.ps_list and world_size >= 1 else max(world_size - 1, 1)
    w = args.worker_num
    ps_list = parse_ps_list(args.ps_list) if args.ps_list else []
    if w < 1:
        raise ConfigError(f"--worker-num {w}: need at least one worker")
    if w > world_size:
        raise ConfigError(f"--worker-num {w} but the job has only {world_size} MPI ranks")
    n_ps = world_size - w
    if n_ps == 0 and not ps_list:
        raise ConfigError(
            f"--worker-num {w} leaves no PS rank among {world_size} MPI ranks; start more ranks "
            f"(mpirun -np {w + 1} ...) or give --ps_list host:port,... of running PS shards"
        )
    if n_ps > 0 and ps_list and len(ps_list) != n_ps:
        raise ConfigError(
            f"--ps_list names {len(ps_list)} addresses but the job has {n_ps} PS "
            f"ranks (world {world_size} - {w} workers)"
        )
    if n_ps == 0 and ps_list and not (args.token_file or os.environ.get("CPU_DIST_TOKEN")):
        raise ConfigError(
            "--ps_list without PS ranks needs the shards' token: --token-file F or $CPU_DIST_TOKEN"
        )
    if args.token_file and not os.path.isfile(args.token_file):
        raise ConfigError(f"--token-file {args.token_file}: no such file")
    if args.batch_size <= 0 or args.batch_size % w:
        raise ConfigError(f"--batch-size {args.batch_size} is not divisible by --worker-num {w}")
    if args.max_step < 0:
        raise ConfigError(f"--max_step {args.max_step}: must be >= 0")
    if args.embedding_dim <= 0:
        raise ConfigError(f"--embedding-dim {args.embedding_dim}: must be positive")
    bot = mlp_widths(args.arch_mlp_bot, "--arch-mlp-bot")
    mlp_widths(args.arch_mlp_top, "--arch-mlp-top")
    if bot[-1] != args.embedding_dim:
        raise ConfigError(
            f"--arch-mlp-bot {args.arch_mlp_bot} must end with --embedding-dim "
            f"{args.embedding_dim} (the dot interaction needs equal widths)"
        )
    if args.arch_mlp_top.split("-")[-1] != "1":
        raise ConfigError(f"--arch-mlp-top {args.arch_mlp_top} must end with 1 (one logit)")
    for name in ("lr", "sparse_lr", "init_scale"):
        v = getattr(args, name)
        if v is not None and (not math.isfinite(v) or v <= 0):
            raise ConfigError(f"--{name.replace('_', '-')} {v}: must be a positive number")
    if args.data == "criteo":
        if not args.data_path:
            raise ConfigError("--data criteo needs --data-path FILE")
        if not os.path.isfile(args.data_path):
            raise ConfigError(f"--data-path {args.data_path}: no such file")
    elif args.data_path:
        raise ConfigError("--data-path is only read with --data criteo")
    if args.ps_max_keys_per_rpc <= 0 or args.ps_channels <= 0 or args.rpc_timeout <= 0:
        raise ConfigError("--ps-max-keys-per-rpc, --ps-channels and --rpc-timeout must be positive")
    if args.print_freq <= 0 or args.eval_every < 0 or args.eval_batches <= 0:
        raise ConfigError("--print-freq and --eval-batches must be positive, --eval-every >= 0")
    if args.sparse_lr is None:
        args.sparse_lr = args.lr
    _validate_checkpoints(args)
    _validate_cache(args)
    if args.init_scale is None:
        args.init_scale = 1.0 / math.sqrt(args.embedding_dim)


def _validate_cache(args: argparse.Namespace) -> None:
    """The cache stage reproduces the PS's SGD on cached rows: only what it can mirror."""
    if args.read_mode != "bagpipe":
        if args.optimization_prescan:
            raise ConfigError("--optimization-prescan needs --read-mode bagpipe")
        return
    if args.optimization_cache_capacity <= 0:
        raise ConfigError(
            f"--optimization-cache-capacity {args.optimization_cache_capacity}: "
            "must be a positive number of 64-row units"
        )
    if args.optimization_plan_window < 0:
        raise ConfigError("--optimization-plan-window must be >= 0")
    if not 0.0 <= args.optimization_bypass_below < 1.0:
        raise ConfigError(
            f"--optimization-bypass-below {args.optimization_bypass_below}: must be in [0, 1)"
        )
    if args.sparse_optimizer != "sgd":
        raise ConfigError(
            f"--read-mode bagpipe supports --sparse-optimizer sgd only, not "
            f"{args.sparse_optimizer}: the cache cannot mirror an adaptive optimizer's "
            "PS-side state"
        )
    # Learning rates: the cache applies the same --sparse-lr that every commit packet carries,
    # and a PS session rejects a packet whose lr differs from the session's, so a cached row
    # and its PS row never step with different rates.


def _validate_checkpoints(args: argparse.Namespace) -> None:
    if args.checkpoint_every < 0 or args.checkpoint_keep < 0:
        raise ConfigError("--checkpoint-every and --checkpoint-keep must be >= 0")
    if (args.resume or args.checkpoint_every) and not args.checkpoint_dir:
        raise ConfigError("--resume and --checkpoint-every need --checkpoint-dir DIR")
    if (
        args.checkpoint_dir
        and os.path.exists(args.checkpoint_dir)
        and not os.path.isdir(args.checkpoint_dir)
    ):
        raise ConfigError(f"--checkpoint-dir {args.checkpoint_dir}: not a directory")


def parse_ps_list(spec: str) -> list[str]:
    out = []
    for item in spec.split(","):
        item = item.strip()
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ConfigError(f"--ps_list entry {item!r}: expected host:port")
        out.append(item)
    return out
