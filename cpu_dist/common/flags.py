"""Command-line flags of launcher.py and the checks that run before any training.

Flag names follow the first designs (``--worker_num``, ``--ps_list``, ``--max_step``) and DLRM's
reference conventions (``--arch-mlp-bot``); both spellings are accepted where they differ.
Every rank parses and validates the same argv, so every rank reaches the same verdict without
communicating, and rank 0 alone prints it.  :func:`validate` returns the typed
:class:`~cpu_dist.common.config.Config`; defaults come from its dataclasses.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence

from cpu_dist.common.config import (
    CacheConfig,
    CheckpointConfig,
    ClientConfig,
    Config,
    DataConfig,
    JobConfig,
    ModelConfig,
    OutputConfig,
    TrainConfig,
)


class ConfigError(ValueError):
    """A flag or flag combination that cannot work; the message names the flag."""


def _add_job_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("job layout")
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
        help="address PS ranks listen on (default: 127.0.0.1 when the job is on one "
        "node, else this node's address)",
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
        "--barrier-timeout",
        type=float,
        default=JobConfig.barrier_timeout_s,
        help="seconds workers wait for each other (a step, a commit that needs "
        "every worker, the end of the job); checkpoints add --checkpoint-timeout",
    )
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
        "--rpc-timeout",
        type=float,
        default=ClientConfig.rpc_timeout_s,
        help="seconds one PS call may take",
    )


def _add_data_and_model_flags(p: argparse.ArgumentParser) -> None:
    d = p.add_argument_group("data")
    d.add_argument("--data", default=DataConfig.kind, choices=["synthetic", "criteo"])
    d.add_argument("--data-path", default=None, help="Criteo TSV file (with --data criteo)")
    d.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="count and skip malformed Criteo lines instead of failing",
    )
    d.add_argument("--zipf-exponent", type=float, default=DataConfig.zipf_exponent)
    m = p.add_argument_group("model")
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


def _add_train_flags(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("training")
    t.add_argument(
        "--batch-size", type=int, default=TrainConfig.batch_size, help="global batch size"
    )
    t.add_argument(
        "--max_step", "--max-step", dest="max_step", type=int, default=TrainConfig.max_step
    )
    t.add_argument("--lr", type=float, default=TrainConfig.lr)
    t.add_argument("--sparse-lr", type=float, default=None, help="default: --lr")
    t.add_argument(
        "--dense-optimizer", default=TrainConfig.dense_optimizer, choices=["sgd", "adamw"]
    )
    t.add_argument(
        "--sparse-optimizer",
        default=TrainConfig.sparse_optimizer,
        choices=["sgd", "rowwise_adagrad"],
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
        "--sparse-sync",
        default=TrainConfig.sparse_sync,
        choices=["pipelined", "barrier"],
        help="pipelined: the next pull waits only for the commit it reads; "
        "barrier: every step waits for its commit before going on",
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
    o.add_argument("--eval-batches", type=int, default=OutputConfig.eval_batches)
    o.add_argument(
        "--dump-state",
        default=None,
        help=".npz with dense/<name>, sparse_keys, sparse_values at the end",
    )
    o.add_argument("--tensorboard", default=None, help="TensorBoard log directory")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="launcher.py",
        description="Train a DLRM across MPI worker ranks and C++ parameter-server ranks.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_job_flags(p)
    _add_data_and_model_flags(p)
    _add_train_flags(p)
    _add_cache_flags(p)
    _add_checkpoint_and_output_flags(p)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def mlp_widths(spec: str, flag: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(x) for x in spec.split("-") if x)
    except ValueError:
        raise ConfigError(
            f"{flag} {spec!r}: expected widths joined by '-', e.g. 512-256-64"
        ) from None
    if not widths or any(w <= 0 for w in widths):
        raise ConfigError(f"{flag} {spec!r}: widths must be positive integers")
    return widths


def parse_ps_list(spec: str) -> tuple[str, ...]:
    out = []
    for item in spec.split(","):
        item = item.strip()
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ConfigError(f"--ps_list entry {item!r}: expected host:port")
        out.append(item)
    return tuple(out)


def _positive(value: float | None, flag: str) -> None:
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise ConfigError(f"{flag} {value}: must be a positive number")


def _job(a: argparse.Namespace, world_size: int) -> JobConfig:
    ps_list = parse_ps_list(a.ps_list) if a.ps_list else ()
    w = a.worker_num
    if w is None:
        w = world_size if ps_list and world_size >= 1 else max(world_size - 1, 1)
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
            f"--ps_list names {len(ps_list)} addresses but the job has {n_ps} PS ranks "
            f"(world {world_size} - {w} workers)"
        )
    if n_ps == 0 and not (a.token_file or os.environ.get("CPU_DIST_TOKEN")):
        raise ConfigError(
            "--ps_list without PS ranks needs the shards' token: --token-file F or $CPU_DIST_TOKEN"
        )
    if a.token_file and not os.path.isfile(a.token_file):
        raise ConfigError(f"--token-file {a.token_file}: no such file")
    _positive(a.barrier_timeout, "--barrier-timeout")
    return JobConfig(
        worker_num=w,
        num_ps_ranks=n_ps,
        ps_list=ps_list,
        ps_host=a.ps_host,
        token_file=a.token_file,
        ps_type=a.ps_type,
        barrier_timeout_s=a.barrier_timeout,
    )


def _model(a: argparse.Namespace) -> ModelConfig:
    dim = a.embedding_dim
    if dim <= 0:
        raise ConfigError(f"--embedding-dim {dim}: must be positive")
    bot_spec = a.arch_mlp_bot if a.arch_mlp_bot is not None else f"512-256-{dim}"
    bot = mlp_widths(bot_spec, "--arch-mlp-bot")
    top = mlp_widths(a.arch_mlp_top, "--arch-mlp-top")
    if bot[-1] != dim:
        raise ConfigError(
            f"--arch-mlp-bot {bot_spec} must end with --embedding-dim {dim} "
            "(the dot interaction needs equal widths)"
        )
    if top[-1] != 1:
        raise ConfigError(f"--arch-mlp-top {a.arch_mlp_top} must end with 1 (one logit)")
    _positive(a.init_scale, "--init-scale")
    scale = a.init_scale if a.init_scale is not None else 1.0 / math.sqrt(dim)
    return ModelConfig(dim, bot, top, a.dtype, scale)


def _train(a: argparse.Namespace, workers: int) -> TrainConfig:
    if a.batch_size <= 0 or a.batch_size % workers:
        raise ConfigError(f"--batch-size {a.batch_size} is not divisible by --worker-num {workers}")
    if a.max_step < 0:
        raise ConfigError(f"--max_step {a.max_step}: must be >= 0")
    _positive(a.lr, "--lr")
    _positive(a.sparse_lr, "--sparse-lr")
    return TrainConfig(
        batch_size=a.batch_size,
        max_step=a.max_step,
        lr=a.lr,
        sparse_lr=a.sparse_lr if a.sparse_lr is not None else a.lr,
        dense_optimizer=a.dense_optimizer,
        sparse_optimizer=a.sparse_optimizer,
        seed=a.seed,
        aggregation=a.aggregation,
        sparse_sync=a.sparse_sync,
    )


def _data(a: argparse.Namespace) -> DataConfig:
    if a.data == "criteo":
        if not a.data_path:
            raise ConfigError("--data criteo needs --data-path FILE")
        if not os.path.isfile(a.data_path):
            raise ConfigError(f"--data-path {a.data_path}: no such file")
    elif a.data_path:
        raise ConfigError("--data-path is only read with --data criteo")
    return DataConfig(a.data, a.data_path, a.skip_bad_lines, a.zipf_exponent)


def _client(a: argparse.Namespace) -> ClientConfig:
    if a.ps_max_keys_per_rpc <= 0 or a.ps_channels <= 0:
        raise ConfigError("--ps-max-keys-per-rpc and --ps-channels must be positive")
    _positive(a.rpc_timeout, "--rpc-timeout")
    return ClientConfig(a.ps_max_keys_per_rpc, a.ps_channels, a.ps_max_message_bytes, a.rpc_timeout)


def _cache(a: argparse.Namespace, train: TrainConfig) -> CacheConfig | None:
    """The cache stage reproduces the PS's SGD on cached rows: only what it can mirror."""
    if a.read_mode != "bagpipe":
        if a.optimization_prescan:
            raise ConfigError("--optimization-prescan needs --read-mode bagpipe")
        return None
    if a.optimization_cache_capacity <= 0:
        raise ConfigError(
            f"--optimization-cache-capacity {a.optimization_cache_capacity}: "
            "must be a positive number of 64-row units"
        )
    if a.optimization_plan_window < 0:
        raise ConfigError("--optimization-plan-window must be >= 0")
    if not 0.0 <= a.optimization_bypass_below < 1.0:
        raise ConfigError(
            f"--optimization-bypass-below {a.optimization_bypass_below}: must be in [0, 1)"
        )
    if train.sparse_optimizer != "sgd":
        raise ConfigError(
            f"--read-mode bagpipe supports --sparse-optimizer sgd only, not "
            f"{train.sparse_optimizer}: the cache cannot mirror an adaptive optimizer's "
            "PS-side state"
        )
    # Learning rates: the cache applies the same --sparse-lr that every commit packet carries,
    # and a PS session rejects a packet whose lr differs from the session's.
    return CacheConfig(
        prescan=a.optimization_prescan,
        capacity_units=a.optimization_cache_capacity,
        plan_window=a.optimization_plan_window,
        bypass_below=a.optimization_bypass_below,
    )


def _checkpoint(a: argparse.Namespace) -> CheckpointConfig:
    if a.checkpoint_every < 0 or a.checkpoint_keep < 0:
        raise ConfigError("--checkpoint-every and --checkpoint-keep must be >= 0")
    if (a.resume or a.checkpoint_every) and not a.checkpoint_dir:
        raise ConfigError("--resume and --checkpoint-every need --checkpoint-dir DIR")
    d = a.checkpoint_dir
    if d and os.path.exists(d) and not os.path.isdir(d):
        raise ConfigError(f"--checkpoint-dir {d}: not a directory")
    _positive(a.checkpoint_timeout, "--checkpoint-timeout")
    return CheckpointConfig(
        d, a.checkpoint_every, a.checkpoint_keep, a.resume, a.checkpoint_timeout
    )


def _output(a: argparse.Namespace) -> OutputConfig:
    if a.print_freq <= 0 or a.eval_every < 0 or a.eval_batches <= 0:
        raise ConfigError("--print-freq and --eval-batches must be positive, --eval-every >= 0")
    return OutputConfig(
        metrics_out=a.metrics_out,
        print_freq=a.print_freq,
        eval_every=a.eval_every,
        eval_batches=a.eval_batches,
        dump_state=a.dump_state,
        tensorboard=a.tensorboard,
        progress=not a.no_progress,
    )


def validate(args: argparse.Namespace, world_size: int) -> Config:
    """The job's Config, or ConfigError for any impossible combination; identical on every
    rank.  ``args`` is not changed."""
    job = _job(args, world_size)
    train = _train(args, job.worker_num)
    return Config(
        job=job,
        model=_model(args),
        train=train,
        data=_data(args),
        client=_client(args),
        cache=_cache(args, train),
        checkpoint=_checkpoint(args),
        output=_output(args),
    )


# Settings (Config.settings() keys) whose flag is not "--" + the field name with dashes.
_FLAG_OF_SETTING = {
    "job.worker_num": "--worker-num",
    "job.barrier_timeout_s": "--barrier-timeout",
    "model.bot_mlp": "--arch-mlp-bot",
    "model.top_mlp": "--arch-mlp-top",
    "data.kind": "--data",
    "data.path": "--data-path",
    "client.channels": "--ps-channels",
    "client.max_keys_per_rpc": "--ps-max-keys-per-rpc",
    "client.max_message_bytes": "--ps-max-message-bytes",
    "client.rpc_timeout_s": "--rpc-timeout",
    "cache.prescan": "--optimization-prescan",
    "cache.capacity_units": "--optimization-cache-capacity",
    "cache.plan_window": "--optimization-plan-window",
    "cache.bypass_below": "--optimization-bypass-below",
    "checkpoint.dir": "--checkpoint-dir",
    "checkpoint.every": "--checkpoint-every",
    "checkpoint.keep": "--checkpoint-keep",
    "checkpoint.timeout_s": "--checkpoint-timeout",
}


def setting_flag(key: str) -> str:
    """The command-line flag of a ``Config.settings()`` key, for error messages."""
    if key in _FLAG_OF_SETTING:
        return _FLAG_OF_SETTING[key]
    return "--" + key.rpartition(".")[2].replace("_", "-")
