"""The job's model from its Config: the one place that turns ``--model`` / ``[model]``, the
MLP and cross-network flags and the job's tables into ``build_model``'s call, so that the
workers, the single-process reference and the export build the same module (and, under
``--seed``, the same dense init)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cpu_dist.common.config import Config
from cpu_dist.embeddings import EmbeddingBagConfig, configs_of
from cpu_dist.embeddings.foreign import job_table_defaults
from cpu_dist.models.factory import build_model

__all__ = ["build_job_model", "model_args", "model_name", "model_tables"]


def model_name(cfg: Config) -> str:
    """``--model`` (a job file's ``[model] name``); ``dlrm`` by default."""
    return cfg.model.name


def model_tables(cfg: Config) -> list[EmbeddingBagConfig]:
    """The job's tables as the model's ``EmbeddingBagConfig`` list (rows seeded by
    ``--seed``, as the shards create them)."""
    return configs_of(cfg.tables, seed=cfg.train.seed)


def model_args(cfg: Config) -> dict[str, Any]:
    """The factory's keyword arguments: a built-in model's from the flags (``dlrm``:
    ``bot_mlp``, ``top_mlp``; ``dcnv2``: those and ``num_layers``, ``low_rank_dim``), then a
    job file's other ``[model]`` keys over them (a user model takes only those)."""
    m, name = cfg.model, model_name(cfg)
    args: dict[str, Any] = {}
    if name in ("dlrm", "dcnv2"):
        args = {"bot_mlp": list(m.bot_mlp), "top_mlp": list(m.top_mlp)}
    if name == "dcnv2":
        args["num_layers"] = m.dcn_num_layers
        args["low_rank_dim"] = m.dcn_low_rank_dim
    for key, value in m.args:
        args[key] = _as_lists(value)
    return args


def _as_lists(value: Any) -> Any:
    """A ``[model]`` value as the TOML file wrote it: arrays (tuples in the Config) as lists,
    at every depth."""
    if isinstance(value, tuple):
        return [_as_lists(v) for v in value]
    return value


def build_job_model(cfg: Config, dense_features: int, notes: list[str] | None = None) -> nn.Module:
    """The job's model, its dense part in ``--dtype`` (``model.dtype``), its collections'
    rows local until a job distributes them (``cpu_dist.train.step_rows.distribute``).  A
    TorchRec ``EmbeddingBagConfig`` the model builds a collection from takes its optimizer and
    lr from the job (``embeddings.foreign``); ``notes`` gets a line per such table."""
    tables = model_tables(cfg)
    with job_table_defaults(cfg.train.sparse_optimizer, cfg.train.sparse_lr, tables) as said:
        model = build_model(
            model_name(cfg), tables, dense_features, model_args(cfg), seed=cfg.train.seed
        )
    if notes is not None:
        notes.extend(said)
    if cfg.model.dtype == "float64":
        model.to(torch.float64)
    return model
