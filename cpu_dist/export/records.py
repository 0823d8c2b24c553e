"""What the export writes of a model (:class:`~cpu_dist.serving.model_record.ModelRecord`):
from a live job (its Config, the model it trains) or from a checkpoint's settings, and of the
data that made the bundle's keys (:func:`data_spec`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from cpu_dist.checkpoint.coordinator import SOURCE_SHA256_KEY  # (older checkpoints lack it)
from cpu_dist.common.config import Config, DataConfig, ModelConfig
from cpu_dist.common.features import CATEGORICAL_FEATURES, NUM_DENSE
from cpu_dist.embeddings import EmbeddingBagConfig, collections_of
from cpu_dist.serving.bundle import DataSpec
from cpu_dist.serving.errors import BundleError
from cpu_dist.serving.model_record import ModelRecord, source_record, table_record

__all__ = [
    "data_spec",
    "job_model_record",
    "job_table_records",
    "settings_model_args",
    "settings_model_record",
]


def job_tables_of_model(cfg: Config, model: nn.Module) -> list[EmbeddingBagConfig]:
    """The tables as the model's collections hold them, in the job's order (the order its
    factory was given them in, and will be again when serving rebuilds it)."""
    held = {c.name: c for _, ebc in collections_of(model) for c in ebc.embedding_bag_configs()}
    missing = [n for n in cfg.tables.names if n not in held]
    if missing or len(held) != len(cfg.tables.names):
        raise BundleError(
            f"the model's collections hold tables {', '.join(held) or 'none'}; the job's are "
            f"{', '.join(cfg.tables.names)}"
        )
    return [held[n] for n in cfg.tables.names]


def job_table_records(cfg: Config, model: nn.Module) -> list[dict[str, Any]]:
    """Every table's record (``model_record.table_record``), in the job's order."""
    return [table_record(c, cfg.train.seed) for c in job_tables_of_model(cfg, model)]


def job_model_record(
    cfg: Config, *, name: str, args: Mapping[str, Any], dense_features: int
) -> ModelRecord:
    """The record of a job's model: ``name`` and ``args`` as the job built it
    (``job_model.model_name`` / ``model_args``), its dtype and seed, its tables' feature
    layout, a user model's source."""
    return ModelRecord(
        name=name,
        args=dict(args),
        dense_features=int(dense_features),
        dtype=cfg.model.dtype,
        seed=int(cfg.train.seed),
        fused=bool(cfg.tables.fused),
        data_features=tuple(cfg.tables.data_features),
        source=source_record(name),
    )


def _model_config(settings: Mapping[str, Any]) -> ModelConfig:
    """The checkpoint's ``model.*`` settings as a ModelConfig (a key it lacks, its default:
    a checkpoint written before ``--model`` trained the built-in dlrm)."""
    values: dict[str, Any] = {}
    for key in ModelConfig.__dataclass_fields__:
        if f"model.{key}" in settings:
            values[key] = settings[f"model.{key}"]
    for key in ("bot_mlp", "top_mlp"):
        if key in values:
            values[key] = tuple(values[key])
    if "args" in values:
        values["args"] = tuple((str(k), v) for k, v in values["args"])
    return ModelConfig(**values)


def settings_model_args(m: ModelConfig) -> dict[str, Any]:
    """The factory's keyword arguments of a ``ModelConfig``: the rule of
    ``cpu_dist.train.job_model.model_args`` (which export may not import), for a checkpoint's
    settings.  A built-in model's from the flags (``dlrm``: ``bot_mlp``, ``top_mlp``;
    ``dcnv2``: those and ``num_layers``, ``low_rank_dim``), then the job file's ``[model]``
    keys over them."""
    args: dict[str, Any] = {}
    if m.name in ("dlrm", "dcnv2"):
        args = {"bot_mlp": list(m.bot_mlp), "top_mlp": list(m.top_mlp)}
    if m.name == "dcnv2":
        args["num_layers"] = int(m.dcn_num_layers)
        args["low_rank_dim"] = int(m.dcn_low_rank_dim)
    for key, value in m.args:
        args[key] = list(value) if isinstance(value, (tuple, list)) else value
    return args


def settings_model_record(
    settings: Mapping[str, Any], tables: Sequence[Mapping[str, Any]]
) -> ModelRecord:
    """The record of a checkpoint's model, from its settings (``Config.settings()``) and its
    tables (``tables``: the manifest's).  A Criteo job has ``NUM_DENSE`` dense features, a
    Parquet job its ``data.dense`` columns and ``data.features``, a synthetic job its
    ``data.num_dense`` and ``data.features`` (older checkpoints lack them: 13, cat_*).  A user
    model's source is hashed as it is now; where the checkpoint recorded the hash it trained
    with (``SOURCE_SHA256_KEY``), another one is refused naming both."""
    m = _model_config(settings)
    source = source_record(m.name)
    trained = settings.get(SOURCE_SHA256_KEY)
    if source is not None and trained is not None and source.sha256 != trained:
        raise BundleError(
            f"model {m.name!r}: its source ({source.origin or source.path}) has sha256 "
            f"{source.sha256} now, but the checkpoint was trained with sha256 {trained}: the "
            "code changed since; export with the code the checkpoint was trained with"
        )
    kind = settings.get("data.kind")
    dense_features, data_features = NUM_DENSE, CATEGORICAL_FEATURES  # Criteo's (JobTables')
    if kind == "parquet":  # its columns: the job's features
        dense_features, data_features = len(settings["data.dense"]), settings["data.features"]
    elif kind == "synthetic":  # [data] dense, its tables' features (empty: cat_0 ... cat_25)
        dense_features = settings.get("data.num_dense", NUM_DENSE)
        data_features = settings.get("data.features") or CATEGORICAL_FEATURES
    return ModelRecord(
        name=m.name,
        args=settings_model_args(m),
        dense_features=int(dense_features),
        dtype=m.dtype,
        seed=int(settings["train.seed"]),
        # a checkpoint before named tables (versions 1 and 2) held the fused table only
        fused=bool(settings.get("tables.fused", len(tables) == 1)),
        data_features=tuple(str(f) for f in data_features),
        source=source,
    )


def data_path(path: str | None) -> str | None:
    """The data's path as a bundle records it: absolute.  A relative path is the job's,
    resolved from the directory the export runs in (a job's: where it ran); one that names
    nothing there is not recorded (None: serving then needs ``--data-path``)."""
    if not path:
        return None
    return os.path.abspath(path) if os.path.exists(path) else None


def data_spec(settings: Mapping[str, Any]) -> DataSpec:
    """The data a job read, from its ``Config.settings()`` (a checkpoint records them all):
    what made the bundle's keys, the global batch size, the multi-hot bags and weights, and
    everything else serving needs to read the same rows (``DataSpec.recorded``): the path,
    Criteo's multi-hot sizes and ``--skip-bad-lines``, Parquet's columns, the synthetic
    stream's dense width and cardinalities (its features: ``features``).  Where a setting is
    missing (a checkpoint of an older version) its default is recorded, as the job ran."""

    def ints(key: str) -> tuple[int, ...] | None:
        v = settings.get(key)
        return None if v is None else tuple(int(n) for n in v)

    synthetic = settings["data.kind"] == "synthetic"  # its shape, else None (not recorded)
    cards = settings.get("data.cardinalities", ())

    return DataSpec(
        kind=str(settings["data.kind"]),
        max_ind_range=settings.get("data.max_ind_range"),
        num_embeddings_per_feature=ints("data.num_embeddings_per_feature"),
        zipf_exponent=float(settings.get("data.zipf_exponent", DataConfig.zipf_exponent)),
        batch_size=int(settings["train.batch_size"]),
        bags=tuple((str(f), int(lo), int(hi)) for f, lo, hi in settings.get("data.bags", ())),
        weights=tuple(str(f) for f in settings.get("data.weights", ())),
        recorded=True,
        path=data_path(settings.get("data.path")),
        skip_bad_lines=bool(settings.get("data.skip_bad_lines", False)),
        multi_hot_sizes=ints("data.multi_hot_sizes"),
        multi_hot_distribution=str(
            settings.get("data.multi_hot_distribution", DataConfig.multi_hot_distribution)
        ),
        features=tuple(str(f) for f in settings.get("data.features", ())),
        weight_columns=tuple((str(f), str(c)) for f, c in settings.get("data.weight_columns", ())),
        label=str(settings.get("data.label", DataConfig.label)),
        dense=tuple(str(c) for c in settings.get("data.dense", ())),
        num_dense=int(settings.get("data.num_dense", DataConfig.num_dense)) if synthetic else None,
        cardinalities=tuple((str(f), int(n)) for f, n in cards) if synthetic else None,
    )
