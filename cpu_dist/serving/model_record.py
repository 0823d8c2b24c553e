"""What an export bundle records of its model, so that serving rebuilds exactly the module the
job trained: the model spec (a built-in name, ``PKG.MODULE:FUNC`` or ``path/file.py:FUNC``),
its factory arguments, the dense feature count, the dense dtype, the job's seed, how the data's
features become the model's (``fused``, ``data_features``: the job's
:class:`~cpu_dist.common.tables.JobTables`), where a user model's code is (:class:`SourceRecord`)
and each table as an :class:`~cpu_dist.embeddings.EmbeddingBagConfig` (:func:`table_record`,
:func:`table_config`).

A user model's code is part of the model: a file spec's source is copied into the bundle
(``model/<file name>``) and a module spec's module path is recorded, each with the sha256 of the
source the weights were trained with, so that a bundle never silently scores with other code
(:func:`check_source`).

The record is plain JSON data, read and checked before any model is built.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cpu_dist.common.contracts import TABLE
from cpu_dist.common.features import categorical_names
from cpu_dist.common.tables import DEFAULT_EPS, DEFAULT_LR
from cpu_dist.embeddings import EmbeddingBagConfig
from cpu_dist.models.factory import ModelError, parse_model_spec, source_sha256
from cpu_dist.serving.errors import BundleError

__all__ = [
    "MODEL_DIR",
    "ModelRecord",
    "SourceRecord",
    "check_source",
    "file_sha256",
    "legacy_record",
    "source_record",
    "table_config",
    "table_record",
]

MODEL_DIR = "model"  # a file spec's source, copied into the bundle


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes (``factory.source_sha256``'s hash)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class SourceRecord:
    """Where a user model's code is, and the sha256 of the source the weights belong to.

    Args:
        kind: ``"file"`` (a ``path/file.py:FUNC`` spec: the bundle holds a copy) or
            ``"module"`` (``PKG.MODULE:FUNC``: imported from ``sys.path`` when loaded).
        path: ``"file"``: the copy's path inside the bundle (``model/<file name>``);
            ``"module"``: the dotted module name.
        sha256: the source's hash at export; None only for a module without a source file
            (nothing to check).
        origin: where the job read it (the resolved file), for messages.
    """

    kind: str
    path: str
    sha256: str | None
    origin: str | None = None


@dataclass(frozen=True)
class ModelRecord:
    """A bundle's model: enough to call ``build_model(name, tables, dense_features, args,
    seed=seed)`` again (the tables are the bundle's ``tables`` list, in the job's order).

    Args:
        name: the model spec as the job gave it (``--model``).
        args: the factory's keyword arguments (``job_model.model_args``), JSON values.
        dense_features: the dense inputs per sample.
        dtype: the dense parameters' dtype (``--dtype``).
        seed: the job's ``--seed``: the dense init's, the data stream's, and the rows' of a
            table whose record has none.
        fused: the default job's one fused table (its keys are the data's fused keys).
        data_features: the data's categorical features in column order.
        source: a user model's code (None for a built-in).
    """

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)
    dense_features: int = 13
    dtype: str = "float32"
    seed: int = 0
    fused: bool = False
    data_features: tuple[str, ...] = ()
    source: SourceRecord | None = None

    def to_json(self) -> dict[str, Any]:
        try:
            args = json.loads(json.dumps(dict(self.args)))
        except (TypeError, ValueError) as exc:
            raise BundleError(
                f"model {self.name!r}: its arguments cannot be recorded as JSON ({exc})"
            ) from None
        return {
            "name": self.name,
            "args": args,
            "dense_features": int(self.dense_features),
            "dtype": self.dtype,
            "seed": int(self.seed),
            "fused": bool(self.fused),
            "data_features": list(self.data_features),
            "source": None if self.source is None else vars(self.source).copy(),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str) -> ModelRecord:
        """The record of a version 4 manifest's ``model``; BundleError naming ``where`` and
        the key for one that is missing or of the wrong type."""
        try:
            source = d.get("source")
            return cls(
                name=str(d["name"]),
                args=dict(d["args"]),
                dense_features=int(d["dense_features"]),
                dtype=str(d["dtype"]),
                seed=int(d["seed"]),
                fused=bool(d["fused"]),
                data_features=tuple(str(f) for f in d["data_features"]),
                source=None if source is None else SourceRecord(**source),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(
                f"{where}: model record unreadable ({type(exc).__name__}: {exc})"
            ) from None


def table_record(config: EmbeddingBagConfig, seed: int) -> dict[str, Any]:
    """A table as a bundle records it: the shard's spec (``TableConfig.spec``: what makes its
    rows, the keys a checkpoint's manifest records too), the features it serves, its ``lr``
    and ``pooling``.  ``seed``: the job's, where the config has none."""
    return {
        **config.spec(seed),
        "features": list(config.feature_names),
        "lr": float(config.lr),
        "pooling": config.pooling.mode,
    }


def table_config(record: Mapping[str, Any], where: str) -> EmbeddingBagConfig:
    """The :class:`EmbeddingBagConfig` of a :func:`table_record` (a record of an older bundle
    lacks ``lr`` and ``pooling``: its model pooled with ``sum``)."""
    name = record.get("name")
    try:
        optimizer = str(record.get("optimizer", "sgd"))
        return EmbeddingBagConfig(
            num_embeddings=int(record.get("num_embeddings", 0)),
            embedding_dim=int(record["dim"]),
            name=str(name),
            feature_names=tuple(record["features"]),
            pooling=record.get("pooling", "sum"),
            optimizer=optimizer,
            lr=float(record.get("lr", DEFAULT_LR)),
            init_scale=float(record["init_scale"]),
            seed=int(record["seed"]),
            admit_after=int(record.get("admit_after", 0)),
            expire_after=int(record.get("expire_after", 0)),
            # a spec holds eps 0 for the optimizers that do not read it
            eps=float(record.get("eps") or DEFAULT_EPS) if optimizer == "adagrad" else DEFAULT_EPS,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(
            f"{where}: table {name!r}: not a table record ({type(exc).__name__}: {exc})"
        ) from None


class LegacySpec(Protocol):
    """What :func:`legacy_record` reads of a DLRM's ``ModelSpec`` (``serving.bundle``)."""

    @property
    def bot_mlp(self) -> Sequence[int]: ...
    @property
    def top_mlp(self) -> Sequence[int]: ...
    @property
    def num_dense(self) -> int: ...
    @property
    def num_sparse(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def seed(self) -> int: ...


def legacy_record(spec: LegacySpec, tables: Sequence[Mapping[str, Any]]) -> ModelRecord:
    """The model of a bundle written before models were recorded (versions 1 to 3, and
    ``export_from_client``'s ``ModelSpec``): always the built-in ``dlrm``; its data's
    features are ``cat_0`` ... ``cat_{num_sparse-1}``, fused into the one table
    ``embedding`` when that is its only table."""
    return ModelRecord(
        name="dlrm",
        args={"bot_mlp": list(spec.bot_mlp), "top_mlp": list(spec.top_mlp)},
        dense_features=int(spec.num_dense),
        dtype=spec.dtype,
        seed=int(spec.seed),
        fused=[t.get("name") for t in tables] == [TABLE],
        data_features=categorical_names(int(spec.num_sparse)),
    )


def source_record(spec: str) -> SourceRecord | None:
    """A user model's code as the bundle records it (None for a built-in): a file spec's
    resolved file, to be copied to ``model/<file name>``; a module spec's dotted name."""
    try:
        parsed = parse_model_spec(spec)
        if parsed.kind == "builtin":
            return None
        origin = parsed.source_file()
        digest = source_sha256(spec)
    except ModelError as exc:
        raise BundleError(f"model {spec!r}: cannot record its source: {exc}") from None
    if parsed.kind == "file":
        assert origin is not None
        return SourceRecord("file", f"{MODEL_DIR}/{origin.name}", digest, str(origin))
    return SourceRecord("module", parsed.target, digest, None if origin is None else str(origin))


def check_source(record: ModelRecord, bundle: Path, shown: Path | None = None) -> str:
    """The model spec to build the bundle's model from, after checking its code is the code
    the weights were trained with: a file spec's copy in the bundle (``bundle/model/...``,
    whose hash must be the recorded one), a module spec's module as imported now (its
    source's hash likewise).  A changed source is refused naming both hashes.  ``shown``: the
    bundle's path as the user gave it, for messages (``bundle`` may be its hidden version)."""
    files, bundle = bundle, shown if shown is not None else bundle
    src = record.source
    spec = parse_model_spec(record.name)
    if spec.kind == "builtin":
        return record.name
    if src is None:
        raise BundleError(
            f"bundle {bundle}: model {record.name!r} is a user model but the bundle records no "
            "source for it"
        )
    if src.kind == "file":
        parts = src.path.split("/")
        if len(parts) != 2 or parts[0] != MODEL_DIR or parts[1] in ("", ".", ".."):
            raise BundleError(f"bundle {bundle}: model source path {src.path!r} is not model/FILE")
        copy = files / src.path
        if not copy.is_file():
            raise BundleError(f"bundle {bundle / src.path}: the model's source file is missing")
        got = file_sha256(copy)
        if got != src.sha256:
            raise BundleError(
                f"bundle {bundle / src.path}: the model's source has sha256 {got}, but the "
                f"bundle was exported with sha256 {src.sha256}: the file changed after the "
                "export"
            )
        return f"{copy}:{spec.func}"
    if src.kind != "module":
        raise BundleError(f"bundle {bundle}: model source kind {src.kind!r} (file or module)")
    module_hash = source_sha256(record.name)
    if src.sha256 is not None and module_hash != src.sha256:
        raise BundleError(
            f"bundle {bundle}: model {record.name!r}: module {src.path}'s source has sha256 "
            f"{module_hash}, but the bundle was exported with sha256 {src.sha256} (from "
            f"{src.origin}): the code changed since the export; install the version it was "
            "trained with"
        )
    return record.name
