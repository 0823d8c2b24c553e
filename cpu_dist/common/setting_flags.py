"""The command-line flag behind each ``Config.settings()`` key, for messages that name what a
user would change (a checkpoint's settings against the job's, a manifest's).  Kept beside the
parser (``flags.py``) rather than in it: the parser defines flags, this names them."""

from __future__ import annotations

_FLAG_OF_SETTING = {
    "job.worker_num": "--worker-num",
    "job.barrier_timeout_s": "--barrier-timeout",
    "train.max_step": "--max_step",
    "train.dense_optimizer_args": "--weight-decay/--betas/--momentum/--eps",
    "model.bot_mlp": "--arch-mlp-bot",
    "model.top_mlp": "--arch-mlp-top",
    "model.name": "--model",
    "model.args": "--config [model]",
    "data.kind": "--data",
    "data.bags": "--config [data] bags",
    "data.weights": "--config [data] weights",
    "data.path": "--data-path",
    "data.weight_columns": "--config [data] weights",
    "data.label": "--config [data] label",
    "data.dense": "--config [data] dense",
    "data.num_dense": "--config [data] dense",
    "data.cardinalities": "--config [data] cardinalities",
    "data.features": "--config [[tables]] features",
    "client.channels": "--ps-channels",
    "client.max_keys_per_rpc": "--ps-max-keys-per-rpc",
    "client.max_message_bytes": "--ps-max-message-bytes",
    "client.rpc_timeout_s": "--rpc-timeout",
    "client.compression": "--ps-compression",
    "table.memory_rows": "--ps-memory-rows",
    "table.memory_bytes": "--ps-memory-bytes",
    "table.ssd_dir": "--ps-ssd-dir",
    "table.admit_after": "--ps-admit-after",
    "table.expire_after": "--ps-expire-after",
    "cache.prescan": "--optimization-prescan",
    "cache.capacity_units": "--optimization-cache-capacity",
    "cache.plan_window": "--optimization-plan-window",
    "cache.bypass_below": "--optimization-bypass-below",
    "checkpoint.dir": "--checkpoint-dir",
    "checkpoint.every": "--checkpoint-every",
    "checkpoint.keep": "--checkpoint-keep",
    "checkpoint.timeout_s": "--checkpoint-timeout",
    "tables.tables": "--config [[tables]]",
    "tables.fused": "--config",
}


def setting_flag(key: str) -> str:
    """The command-line flag of a ``Config.settings()`` key, for error messages."""
    if key in _FLAG_OF_SETTING:
        return _FLAG_OF_SETTING[key]
    return "--" + key.rpartition(".")[2].replace("_", "-")
