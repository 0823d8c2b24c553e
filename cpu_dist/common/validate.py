"""The checks that run before any training: the parsed flags (``cpu_dist.common.flags``) become
one frozen :class:`~cpu_dist.common.config.Config`, or a ConfigError that names the flag.
Every rank runs them on the same argv, so every rank reaches the same verdict."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from cpu_dist.common.config import (
    CacheConfig,
    CheckpointConfig,
    ClientConfig,
    Config,
    DataConfig,
    JobConfig,
    ModelConfig,
    OutputConfig,
    TableConfig,
    TrainConfig,
)
from cpu_dist.common.contracts import default_init_scale
from cpu_dist.common.files import (
    OutputError,
    check_output_dir,
    check_output_file,
    describe_dir,
    is_export_bundle,
    is_metrics_log,
    is_state_dump,
    is_tensorboard_dir,
    manifest_format,
)
from cpu_dist.common.flags import launch_rank
from cpu_dist.common.job_file import JobFileError, TableDefaults, job_tables, read_job_file
from cpu_dist.common.tables import CATEGORICAL_FEATURES, FROM_FLAGS, JobTables


class ConfigError(ValueError):
    """A flag or flag combination that cannot work; the message names the flag."""


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
    if bot[-1] != dim:
        width = (
            f"the tables' dim {dim} (--config {tables.source})"
            if tables is not None and tables.uniform_dim is not None
            else f"--embedding-dim {dim}"
        )
        raise ConfigError(
            f"--arch-mlp-bot {bot_spec} must end with {width} "
            "(the dot interaction needs equal widths)"
        )
    if top[-1] != 1:
        raise ConfigError(f"--arch-mlp-top {a.arch_mlp_top} must end with 1 (one logit)")
    _positive(a.init_scale, "--init-scale")
    scale = a.init_scale if a.init_scale is not None else default_init_scale(dim)
    if tables is not None and len({t.init_scale for t in tables.tables}) == 1:
        scale = tables.tables[0].init_scale
    return ModelConfig(dim, bot, top, a.dtype, scale)


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
    return TrainConfig(
        batch_size=a.batch_size,
        max_step=a.max_step if a.max_step is not None else TrainConfig.max_step,
        max_step_given=a.max_step is not None,
        lr=a.lr,
        sparse_lr=a.sparse_lr if a.sparse_lr is not None else a.lr,
        dense_optimizer=a.dense_optimizer,
        sparse_optimizer=a.sparse_optimizer,
        seed=a.seed,
        aggregation=a.aggregation,
        sparse_sync=a.sparse_sync,
        max_staleness=a.max_staleness,
        dense_sync=a.dense_sync,
    )


def _hash_sizes(a: argparse.Namespace) -> tuple[int, ...] | None:
    spec = a.num_embeddings_per_feature
    if spec is None:
        return None
    try:
        sizes = tuple(int(x) for x in spec.split(","))
    except ValueError:
        raise ConfigError(
            f"--num-embeddings-per-feature {spec!r}: expected 26 integers joined by ','"
        ) from None
    if len(sizes) != 26:
        raise ConfigError(
            f"--num-embeddings-per-feature: {len(sizes)} sizes given, Criteo has 26 features"
        )
    if any(not 0 < n <= 2**32 for n in sizes):
        raise ConfigError(f"--num-embeddings-per-feature {spec}: sizes must be in [1, 2**32]")
    return sizes


def data_config(a: argparse.Namespace) -> DataConfig:
    """The data section alone (tools that read the same batches as a job)."""
    if a.data == "criteo":
        if not a.data_path:
            raise ConfigError("--data criteo needs --data-path FILE")
        if os.path.isdir(a.data_path):
            hint = (
                " (a converted directory: --data criteo-bin)"
                if os.path.isfile(os.path.join(a.data_path, "manifest.json"))
                else ""
            )
            raise ConfigError(
                f"--data-path {a.data_path}: is a directory; --data criteo reads one TSV file{hint}"
            )
        if not os.path.isfile(a.data_path):
            raise ConfigError(f"--data-path {a.data_path}: no such file")
    elif a.data == "criteo-bin":
        if not a.data_path:
            raise ConfigError("--data criteo-bin needs --data-path DIR")
        if os.path.isfile(a.data_path):
            raise ConfigError(
                f"--data-path {a.data_path}: is a file; --data criteo-bin reads a directory "
                "made by python -m cpu_dist.data.convert (a TSV file: --data criteo)"
            )
        if not os.path.exists(a.data_path):
            raise ConfigError(f"--data-path {a.data_path}: no such directory")
        if not os.path.isfile(os.path.join(a.data_path, "manifest.json")):
            raise ConfigError(
                f"--data-path {a.data_path}: no manifest.json (not a finished conversion: run "
                "python -m cpu_dist.data.convert INPUT... --output DIR)"
            )
    elif a.data_path:
        raise ConfigError("--data-path is only read with --data criteo or criteo-bin")
    if a.skip_bad_lines and a.data == "criteo-bin":
        raise ConfigError(
            "--skip-bad-lines applies to --data criteo; give it to the converter instead"
        )
    sizes = _hash_sizes(a)
    if a.max_ind_range is not None and not 0 < a.max_ind_range <= 2**32:
        raise ConfigError(f"--max-ind-range {a.max_ind_range}: must be in [1, 2**32]")
    if a.epochs is not None and a.epochs < 1:
        raise ConfigError(f"--epochs {a.epochs}: must be >= 1")
    if a.data == "synthetic":
        given = [
            flag
            for flag, value in (
                ("--num-embeddings-per-feature", sizes),
                ("--max-ind-range", a.max_ind_range),
                ("--epochs", a.epochs),
                ("--shuffle", a.shuffle or None),
            )
            if value is not None
        ]
        if given:
            raise ConfigError(
                f"{', '.join(given)}: only for --data criteo or criteo-bin (the synthetic "
                "stream has its own key space and never ends)"
            )
    return DataConfig(
        kind=a.data,
        path=a.data_path,
        skip_bad_lines=a.skip_bad_lines,
        zipf_exponent=a.zipf_exponent,
        num_embeddings_per_feature=sizes,
        max_ind_range=a.max_ind_range,
        epochs=_epochs(a),
        shuffle=a.shuffle,
    )


def _epochs(a: argparse.Namespace) -> int | None:
    """--epochs, else one pass, unless --max_step alone says how long to train (then the
    passes go on until it: None)."""
    if a.epochs is not None:
        return int(a.epochs)
    if a.data != "synthetic" and getattr(a, "max_step", None) is not None:
        return None
    return DataConfig.epochs


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


def job_file_tables(a: argparse.Namespace, train: TrainConfig) -> JobTables | None:
    """The tables of the ``--config`` job file (None: no job file, or one without
    ``[[tables]]``: the flags declare the one table).  A table that omits a key takes the
    flags' value (``--embedding-dim``, ``--sparse-optimizer``, ``--sparse-lr``,
    ``--init-scale``, ``--ps-admit-after``, ``--ps-expire-after``)."""
    path = getattr(a, "config", None)
    if not path:
        return None
    for flag, value in (
        ("--num-embeddings-per-feature", a.num_embeddings_per_feature),
        ("--max-ind-range", a.max_ind_range),
    ):
        if value is not None:
            raise ConfigError(
                f"{flag}: refused beside a job file (--config {path}): give each table its "
                "num_embeddings"
            )
    for flag, value in (
        ("--ps-admit-after", a.ps_admit_after),
        ("--ps-expire-after", a.ps_expire_after),
    ):
        if value < 0:
            raise ConfigError(f"{flag} {value}: must be >= 0")
    try:
        job_file = getattr(a, "job_file", None) or read_job_file(path)
        return job_tables(
            job_file,
            TableDefaults(
                dim=a.embedding_dim,
                optimizer=a.sparse_optimizer,
                lr=train.sparse_lr,
                init_scale=a.init_scale,
                admit_after=a.ps_admit_after,
                expire_after=a.ps_expire_after,
            ),
            CATEGORICAL_FEATURES,  # every data kind's: Criteo's and the synthetic stream's
            a.data,
        )
    except JobFileError as exc:
        raise ConfigError(str(exc)) from None


def _table(a: argparse.Namespace, tables: JobTables | None) -> TableConfig:
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
    if tables is not None and len(tables.tables) > 1 and a.ps_memory_rows:
        raise ConfigError(
            f"--ps-memory-rows with {len(tables.tables)} tables (--config {tables.source}): "
            "rows of different widths cost different memory; give the budget in bytes, "
            "--ps-memory-bytes N"
        )
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
    return TableConfig(
        a.ps_memory_rows, a.ps_ssd_dir, a.ps_admit_after, a.ps_expire_after, a.ps_memory_bytes
    )


def _cache(
    a: argparse.Namespace, train: TrainConfig, tables: JobTables | None
) -> CacheConfig | None:
    """The cache stage reproduces the PS's SGD on cached rows: only what it can mirror."""
    if a.read_mode != "bagpipe":
        if a.optimization_prescan:
            raise ConfigError("--optimization-prescan needs --read-mode bagpipe")
        return None
    if tables is not None:
        many = f"{len(tables.tables)} tables" if len(tables.tables) > 1 else "a table"
        raise ConfigError(
            f"--read-mode bagpipe with {many} of a job file (--config {tables.source}): the "
            "cache stage serves the flags' one fused table only for now (a later version "
            "makes it per table); drop --read-mode bagpipe or the job file's [[tables]]"
        )
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
    if a.ps_admit_after > 1 or a.ps_expire_after > 0:
        raise ConfigError(
            "--read-mode bagpipe does not support --ps-admit-after or --ps-expire-after: the "
            "cache's coherence rules assume every gradient is applied to the PS rows"
        )
    if a.ps_compression != "none":
        raise ConfigError(
            f"--read-mode bagpipe does not support --ps-compression {a.ps_compression}: the "
            "cache keeps exact copies of the PS rows, which compressed pulls and gradients "
            "are not"
        )
    if train.sparse_sync == "async":
        raise ConfigError(
            "--read-mode bagpipe needs a synchronous --sparse-sync (pipelined or barrier): "
            "the cache keeps its rows equal to the PS rows by applying each step's update in "
            "order, which asynchronous commits do not give it"
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
    )


def _check_checkpoint_kind(d: str) -> None:
    """Checkpoints go into ``step-NNNNNNNN/`` folders under ``--checkpoint-dir`` (and old ones
    are pruned there): a directory of another kind is no place for them."""
    p = Path(d)
    if p.is_dir() and (manifest_format(p) is not None or (p / "part.json").exists()):
        raise ConfigError(
            f"--checkpoint-dir {d}: is {describe_dir(p)}, not a checkpoint directory "
            "(checkpoints go into step-NNNNNNNN/ folders under it); give its own directory"
        )


def check_outputs(a: argparse.Namespace) -> None:
    """Nothing a flag names is overwritten unless it is an earlier output of the same kind:
    each output path is missing, empty, or of its own kind, and no two paths (outputs, data,
    checkpoints) are the same."""
    try:
        if a.export:
            check_output_dir(a.export, "--export", "an export bundle", is_export_bundle)
        if a.tensorboard:
            check_output_dir(
                a.tensorboard, "--tensorboard", "TensorBoard event files", is_tensorboard_dir
            )
        if a.dump_state:
            check_output_file(a.dump_state, "--dump-state", "a state dump (.npz)", is_state_dump)
        if a.metrics_out:
            check_output_file(
                a.metrics_out, "--metrics-out", "a metrics log (JSON lines)", is_metrics_log
            )
    except OutputError as exc:
        raise ConfigError(str(exc)) from None
    if a.checkpoint_dir:
        _check_checkpoint_kind(a.checkpoint_dir)
    named = [
        (flag, os.path.realpath(path))
        for flag, path in (
            ("--export", a.export),
            ("--tensorboard", a.tensorboard),
            ("--dump-state", a.dump_state),
            ("--metrics-out", a.metrics_out),
            ("--checkpoint-dir", a.checkpoint_dir),
            ("--data-path", a.data_path),
            ("--ps-ssd-dir", a.ps_ssd_dir),
            ("--token-file", a.token_file),
        )
        if path
    ]
    for i, (flag, path) in enumerate(named):
        for other, other_path in named[i + 1 :]:
            if path == other_path:
                raise ConfigError(
                    f"{flag} and {other} name the same path {path}: one would overwrite the other"
                )


def ineffective_flags(a: argparse.Namespace, job: JobConfig) -> list[str]:
    """Flags the command line gave (``a.given``, from ``flags.parse_args``) that change nothing
    in the chosen mode: a warning each, so that a user learns the setting was not applied."""
    given: frozenset[str] = getattr(a, "given", frozenset())
    external = job.external_shards
    rules = [
        ("max_staleness", a.sparse_sync != "async", "--max-staleness", "--sparse-sync async"),
        ("zipf_exponent", a.data != "synthetic", "--zipf-exponent", "--data synthetic"),
        (
            "checkpoint_keep",
            not a.checkpoint_dir,
            "--checkpoint-keep",
            "--checkpoint-dir",
        ),
        ("checkpoint_timeout", not a.checkpoint_dir, "--checkpoint-timeout", "--checkpoint-dir"),
        ("reuse_shard_rows", not external, "--reuse-shard-rows", "external --ps_list shards"),
        ("token_file", not external, "--token-file", "external --ps_list shards"),
        ("ps_host", external, "--ps-host", "PS ranks in the job"),
        ("ps_interface", external, "--ps-interface", "PS ranks in the job"),
        ("session_idle_timeout", external, "--session-idle-timeout", "PS ranks in the job"),
        ("ps_memory_rows", external, "--ps-memory-rows", "PS ranks in the job"),
        ("ps_memory_bytes", external, "--ps-memory-bytes", "PS ranks in the job"),
        ("ps_ssd_dir", external, "--ps-ssd-dir", "PS ranks in the job"),
        (
            "optimization_plan_window",
            not a.optimization_prescan,
            "--optimization-plan-window",
            "--optimization-prescan",
        ),
    ]
    out = [
        f"{flag} has no effect without {needs}"
        for dest, unused, flag, needs in rules
        if dest in given and unused
    ]
    if a.read_mode != "bagpipe":
        for dest in ("optimization_cache_capacity", "optimization_bypass_below"):
            if dest in given:
                out.append(f"--{dest.replace('_', '-')} has no effect without --read-mode bagpipe")
    return out + _table_defaults_unused(a, given)


# The flags that are the defaults of a job file's tables, and the table key each stands for.
_TABLE_DEFAULT_FLAGS = (
    ("embedding_dim", "dim"),
    ("sparse_optimizer", "optimizer"),
    ("sparse_lr", "lr"),
    ("init_scale", "init_scale"),
    ("ps_admit_after", "admit_after"),
    ("ps_expire_after", "expire_after"),
)


def _table_defaults_unused(a: argparse.Namespace, given: frozenset[str]) -> list[str]:
    """A table-default flag given where every table of the job file sets that key itself (a
    table's own keys are never overridden).  ``--embedding-dim`` still sets the model's width
    when the tables' widths differ, so it is named only when they are one."""
    job_file = getattr(a, "job_file", None)
    if job_file is None or not job_file.tables:
        return []
    entries = job_file.tables
    out = []
    for dest, key in _TABLE_DEFAULT_FLAGS:
        if dest not in given or not all(key in t for t in entries):
            continue
        if key == "dim" and len({repr(t["dim"]) for t in entries}) > 1:
            continue
        flag = "--" + dest.replace("_", "-")
        out.append(f"{flag} has no effect: every table of --config {job_file.path} sets {key}")
    return out


def validate(args: argparse.Namespace, world_size: int) -> Config:
    """The job's Config, or ConfigError for any impossible combination; identical on every
    rank.  ``args`` is not changed."""
    job = _job(args, world_size)
    train = _train(args, job.worker_num)
    check_outputs(args)
    tables = job_file_tables(args, train)  # first: it refuses the hashing flags beside it
    data = data_config(args)
    config = Config(
        job=job,
        model=_model(args, tables),
        train=train,
        data=data,
        client=_client(args),
        table=_table(args, tables),
        cache=_cache(args, train, tables),
        checkpoint=_checkpoint(args),
        output=_output(args),
        tables=tables if tables is not None else FROM_FLAGS,
    )
    if launch_rank() == 0:  # every rank reaches the same verdict; rank 0 speaks for all
        for warning in ineffective_flags(args, job):
            print(f"launcher.py: warning: {warning}", file=sys.stderr, flush=True)
    return config
