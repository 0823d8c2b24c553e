"""The checks that run before any training: the parsed flags (``cpu_dist.common.flags``) become
one frozen :class:`~cpu_dist.common.config.Config`, or a ConfigError that names the flag.
Every rank runs them on the same argv, so every rank reaches the same verdict."""

from __future__ import annotations

import argparse
import math
import os
import sys

from cpu_dist.common import modes
from cpu_dist.common.config import (
    CacheConfig,
    CheckpointConfig,
    ClientConfig,
    Config,
    JobConfig,
    ModelConfig,
    OutputConfig,
    ShardStorageConfig,
    TrainConfig,
    model_spec_problem,
)
from cpu_dist.common.config_errors import ConfigError, as_config_error
from cpu_dist.common.contracts import default_init_scale
from cpu_dist.common.data_checks import parquet_columns, parquet_schema
from cpu_dist.common.dense_optimizer import FLAGS as DENSE_SETTING_FLAGS
from cpu_dist.common.dense_optimizer import dense_optimizer_args
from cpu_dist.common.features import CATEGORICAL_FEATURES
from cpu_dist.common.files import OutputError
from cpu_dist.common.first_rank import launch_rank
from cpu_dist.common.flag_warnings import ineffective_flags
from cpu_dist.common.job_file_checks import (
    check_cache_tables,
    check_rows_budget,
    job_file_of,
    job_file_tables,
)
from cpu_dist.common.metric_spec import metric_spec_problem
from cpu_dist.common.output_checks import check_outputs
from cpu_dist.common.tables import FROM_FLAGS, JobTables
from cpu_dist.common.validate_data import data_config


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
        if not sep or not host or not port.isdigit():
            raise ConfigError(f"--ps_list entry {item!r}: expected host:port")
        if not 0 <= int(port) < 65536:
            raise ConfigError(f"--ps_list entry {item!r}: port {port} is not in 0..65535")
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
    if not (math.isfinite(a.session_idle_timeout) and a.session_idle_timeout >= 0):
        raise ConfigError(f"--session-idle-timeout {a.session_idle_timeout}: must be >= 0")
    if not 0 <= a.worker_nice <= 19:
        raise ConfigError(f"--worker-nice {a.worker_nice}: must be in 0..19 (a nice increment)")
    if a.worker_threads < 0:
        raise ConfigError(
            f"--worker-threads {a.worker_threads}: must be >= 0 (0: the node's share)"
        )
    return JobConfig(
        worker_num=w,
        num_ps_ranks=n_ps,
        ps_list=ps_list,
        ps_host=a.ps_host,
        ps_interface=a.ps_interface,
        token_file=a.token_file,
        ps_type=a.ps_type,
        barrier_timeout_s=a.barrier_timeout,
        reuse_shard_rows=a.reuse_shard_rows,
        session_idle_timeout_s=a.session_idle_timeout,
        worker_nice=a.worker_nice,
        worker_threads=a.worker_threads,
    )


def _model(a: argparse.Namespace, tables: JobTables | None) -> ModelConfig:
    """With a job file whose tables share one width, that width is the model's (the bottom
    MLP's default end, the dot interaction's); --embedding-dim is then only the default of
    tables that omit ``dim``."""
    dim = a.embedding_dim
    if dim <= 0:
        raise ConfigError(f"--embedding-dim {dim}: must be positive")
    if tables is not None and tables.uniform_dim is not None:
        dim = tables.uniform_dim
    bot_spec = a.arch_mlp_bot if a.arch_mlp_bot is not None else f"512-256-{dim}"
    bot = mlp_widths(bot_spec, "--arch-mlp-bot")
    top = mlp_widths(a.arch_mlp_top, "--arch-mlp-top")
    if bot[-1] != dim and tables is None and a.model == "dlrm":
        # The default job's DLRM: a bottom MLP that does not end in --embedding-dim would
        # project all 26 features to its width, which a typo is likelier to mean than a
        # choice.  With a job file (or another model) features of another width than the
        # bottom MLP's end are projected (DLRM's proj.<i>), or the model decides.
        raise ConfigError(
            f"--arch-mlp-bot {bot_spec} must end with --embedding-dim {dim} "
            "(the dot interaction needs equal widths)"
        )
    if top[-1] != 1:
        raise ConfigError(f"--arch-mlp-top {a.arch_mlp_top} must end with 1 (one logit)")
    _positive(a.init_scale, "--init-scale")
    scale = a.init_scale if a.init_scale is not None else default_init_scale(dim)
    if tables is not None and len({t.init_scale for t in tables.tables}) == 1:
        scale = tables.tables[0].init_scale
    problem = model_spec_problem(a.model)
    if problem is not None:
        raise ConfigError(f"--model {a.model!r}: {problem}")
    for flag, value in (
        ("--dcn-num-layers", a.dcn_num_layers),
        ("--dcn-low-rank-dim", a.dcn_low_rank_dim),
    ):
        if value < 1:
            raise ConfigError(f"{flag} {value}: must be >= 1")
    with as_config_error():
        job_file = job_file_of(a)
    return ModelConfig(
        dim,
        bot,
        top,
        a.dtype,
        scale,
        name=a.model,
        args=job_file.model_args if job_file is not None else (),
        dcn_num_layers=a.dcn_num_layers,
        dcn_low_rank_dim=a.dcn_low_rank_dim,
    )


def _train(a: argparse.Namespace, workers: int) -> TrainConfig:
    if a.batch_size <= 0:
        raise ConfigError(f"--batch-size {a.batch_size}: must be a positive number of samples")
    if a.batch_size % workers:
        raise ConfigError(f"--batch-size {a.batch_size} is not divisible by --worker-num {workers}")
    if a.max_step is not None and a.max_step < 1:
        raise ConfigError(f"--max_step {a.max_step}: must be >= 1 (a run that trains no step)")
    _positive(a.lr, "--lr")
    _positive(a.sparse_lr, "--sparse-lr")
    if not 0 <= a.max_staleness <= 63:
        raise ConfigError(f"--max-staleness {a.max_staleness}: must be in 0..63")
    _schedule(a)
    dense_args = dense_optimizer_args(
        a.dense_optimizer, {k: getattr(a, k, None) for k in DENSE_SETTING_FLAGS}
    )
    return TrainConfig(
        batch_size=a.batch_size,
        max_step=a.max_step if a.max_step is not None else TrainConfig.max_step,
        max_step_given=a.max_step is not None,
        lr=a.lr,
        sparse_lr=a.sparse_lr if a.sparse_lr is not None else a.lr,
        dense_optimizer=a.dense_optimizer,
        dense_optimizer_args=dense_args,
        sparse_optimizer=a.sparse_optimizer,
        seed=a.seed,
        aggregation=a.aggregation,
        sparse_sync=a.sparse_sync,
        max_staleness=a.max_staleness,
        dense_sync=a.dense_sync,
        lr_warmup_steps=a.lr_warmup_steps,
        lr_decay_start=a.lr_decay_start,
        lr_decay_steps=a.lr_decay_steps,
        lr_decay_power=a.lr_decay_power,
        lr_min=a.lr_min,
    )


def _schedule(a: argparse.Namespace) -> None:
    """The learning-rate schedule's flags, each named where it is wrong."""
    for flag in ("lr_warmup_steps", "lr_decay_start", "lr_decay_steps"):
        if getattr(a, flag) < 0:
            raise ConfigError(f"--{flag.replace('_', '-')} {getattr(a, flag)}: must be >= 0")
    if a.lr_decay_steps and a.lr_decay_start < a.lr_warmup_steps:
        raise ConfigError(
            f"--lr-decay-start {a.lr_decay_start}: the decay must start after the warmup "
            f"(--lr-warmup-steps {a.lr_warmup_steps}) ends"
        )
    if not (math.isfinite(a.lr_decay_power) and a.lr_decay_power > 0):
        raise ConfigError(f"--lr-decay-power {a.lr_decay_power}: must be a positive number")
    if not (math.isfinite(a.lr_min) and a.lr_min >= 0):
        raise ConfigError(f"--lr-min {a.lr_min}: must be a number >= 0")


def _client(a: argparse.Namespace) -> ClientConfig:
    if a.ps_max_keys_per_rpc <= 0 or a.ps_channels <= 0:
        raise ConfigError("--ps-max-keys-per-rpc and --ps-channels must be positive")
    _positive(a.rpc_timeout, "--rpc-timeout")
    return ClientConfig(
        a.ps_max_keys_per_rpc,
        a.ps_channels,
        a.ps_max_message_bytes,
        a.rpc_timeout,
        a.ps_compression,
    )


def _storage(a: argparse.Namespace, tables: JobTables | None) -> ShardStorageConfig:
    for flag, value in (
        ("--ps-memory-rows", a.ps_memory_rows),
        ("--ps-memory-bytes", a.ps_memory_bytes),
        ("--ps-admit-after", a.ps_admit_after),
        ("--ps-expire-after", a.ps_expire_after),
    ):
        if value < 0:
            raise ConfigError(f"{flag} {value}: must be >= 0")
    if a.ps_memory_rows and a.ps_memory_bytes:
        raise ConfigError(
            "--ps-memory-rows and --ps-memory-bytes: give one DRAM budget (bytes count every "
            "row's values, state, key and metadata, whatever its table's width)"
        )
    with as_config_error():
        check_rows_budget(a, tables)
    if a.ps_memory_bytes and not a.ps_ssd_dir:
        raise ConfigError(
            f"--ps-memory-bytes {a.ps_memory_bytes} needs --ps-ssd-dir DIR: the shards evict "
            "the rows over the budget to their SSD tier"
        )
    if a.ps_ssd_dir and not (a.ps_memory_rows or a.ps_memory_bytes):
        raise ConfigError(
            "--ps-ssd-dir needs a DRAM budget: --ps-memory-bytes N (or, for one table, "
            "--ps-memory-rows N)"
        )
    return ShardStorageConfig(
        a.ps_memory_rows, a.ps_ssd_dir, a.ps_admit_after, a.ps_expire_after, a.ps_memory_bytes
    )


def _cache(a: argparse.Namespace, job: JobConfig, tables: JobTables | None) -> CacheConfig | None:
    """The cache stage reproduces the PS's SGD on cached rows: only what it can mirror.  Its
    limits are checked here, not in ``gpu_cache``: the launcher validates before MPI starts,
    and the bottom layer may not import the cache stage (tests/test_layers.py)."""
    if a.read_mode != "bagpipe":
        if a.optimization_prescan:
            raise ConfigError("--optimization-prescan needs --read-mode bagpipe")
        return None
    with as_config_error():
        check_cache_tables(tables)
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
    # the refusals of the table of modes' cache row (a job file's tables: check_cache_tables)
    job_tables = tables.tables if tables is not None else ()
    facts = modes.facts_of_flags(a, job.worker_num, job.external_shards, job_tables)
    refused = modes.refusal("cache", facts, vars(a))
    if refused:
        raise ConfigError(refused)
    # Learning rates: each table's cache applies the lr that its part of every commit packet
    # carries (--sparse-lr, or the table's lr), and a PS session rejects another.
    cache = CacheConfig(
        prescan=a.optimization_prescan,
        capacity_units=a.optimization_cache_capacity,
        plan_window=a.optimization_plan_window,
        bypass_below=a.optimization_bypass_below,
    )
    if tables is not None:
        try:
            cache.table_units(tables, a.embedding_dim)
        except ValueError as exc:
            raise ConfigError(f"--config {tables.source}: {exc}") from None
    return cache


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


def _all(n: int) -> int | None:
    """A batch count flag's value: -1 is every batch (None)."""
    return None if n == -1 else n


def _output(a: argparse.Namespace) -> OutputConfig:
    if a.print_freq <= 0 or a.eval_every < 0:
        raise ConfigError("--print-freq must be positive, --eval-every >= 0")
    if a.eval_batches is not None and not (a.eval_batches > 0 or a.eval_batches == -1):
        raise ConfigError(f"--eval-batches {a.eval_batches}: must be -1 (all) or positive")
    if a.test_batches < -1:
        raise ConfigError(f"--test-batches {a.test_batches}: must be -1 (all), 0 (none) or more")
    if a.metric_window < 0:
        raise ConfigError(f"--metric-window {a.metric_window}: must be >= 0 (0: none)")
    for spec in a.metric:
        problem = metric_spec_problem(spec)
        if problem is not None:
            raise ConfigError(f"--metric {spec}: {problem}")
    return OutputConfig(
        metrics_out=a.metrics_out,
        print_freq=a.print_freq,
        eval_every=a.eval_every,
        eval_batches=OutputConfig.eval_batches if a.eval_batches is None else _all(a.eval_batches),
        final_eval_batches=None if a.eval_batches is None else _all(a.eval_batches),
        test_batches=None if a.test_batches == -1 else a.test_batches,
        dump_state=a.dump_state,
        export=a.export,
        tensorboard=a.tensorboard,
        progress=not a.no_progress,
        metric_window=a.metric_window,
        metrics=tuple(a.metric),
        verbose_summary=a.verbose_summary,
    )


def validate(args: argparse.Namespace, world_size: int) -> Config:
    """The job's Config, or ConfigError for any impossible combination; identical on every
    rank.  ``args`` is not changed."""
    job = _job(args, world_size)
    train = _train(args, job.worker_num)
    try:
        check_outputs(args)
    except OutputError as exc:
        raise ConfigError(str(exc)) from None
    parquet = None
    with as_config_error():  # first: it refuses the hashing flags beside it
        schema = parquet_schema(args) if args.data == "parquet" else None
        tables = job_file_tables(args, train, None if schema is None else schema.candidates)
        if schema is not None:
            features = None if tables is None else tables.data_features
            parquet = parquet_columns(args, schema, features)
    data = data_config(
        args, tables.data_features if tables is not None else CATEGORICAL_FEATURES, parquet, tables
    )
    config = Config(
        job=job,
        model=_model(args, tables),
        train=train,
        data=data,
        client=_client(args),
        storage=_storage(args, tables),
        cache=_cache(args, job, tables),
        checkpoint=_checkpoint(args),
        output=_output(args),
        tables=tables if tables is not None else FROM_FLAGS,
    )
    if launch_rank() == 0:  # every rank reaches the same verdict; rank 0 speaks for all
        for warning in ineffective_flags(args, job):
            print(f"launcher.py: warning: {warning}", file=sys.stderr, flush=True)
    return config
