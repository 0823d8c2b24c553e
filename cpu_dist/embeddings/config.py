"""``EmbeddingBagConfig``: one embedding table in TorchRec's names, plus this framework's own
per-table keys, and its conversion to and from a job's :class:`~cpu_dist.common.tables.TableConfig`.

TorchRec's fields come first, in TorchRec's order (``num_embeddings``, ``embedding_dim``,
``name``, ``data_type``, ``feature_names``, ``weight_init_max``, ``weight_init_min``,
``pooling``), so a TorchRec model's table list reads the same here.  Our keys follow:
``optimizer``, ``lr``, ``init_scale``, ``seed``, ``admit_after``, ``expire_after``, ``eps``, with
the names, defaults and ranges of a job file's ``[[tables]]`` entry
(:mod:`cpu_dist.common.job_file`), whose constants are imported, never restated, so that one
table means the same thing in a job file, on a shard and in a user's model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum, unique
from typing import Any

from cpu_dist.common.contracts import default_init_scale
from cpu_dist.common.job_file import _UINT32, NAME_RE
from cpu_dist.common.tables import (
    DEFAULT_EPS,
    DEFAULT_LR,
    OPTIMIZERS,
    POOLINGS,
    JobTables,
    TableConfig,
)

__all__ = ["DataType", "EmbeddingBagConfig", "PoolingType", "configs_of", "job_tables_of"]

MAX_DIM = 1 << 16  # a [[tables]] entry's dim range (cpu_dist/common/job_file.py)
MAX_NUM_EMBEDDINGS = 2**63 - 1


@unique
class PoolingType(Enum):
    """How a bag's rows become one vector (TorchRec's enum, its values).

    Args:
        SUM: the rows' sum (weighted by the per-id weights where given).
        MEAN: that sum divided by the bag's length (FBGEMM's convention, also when weighted);
            an empty bag pools to zeros either way.
    """

    SUM = "SUM"
    MEAN = "MEAN"

    @property
    def mode(self) -> str:
        """The job file's spelling: ``"sum"`` or ``"mean"`` (``common.tables.POOLINGS``)."""
        return self.value.lower()


@unique
class DataType(Enum):
    """The rows' storage type (TorchRec's ``torchrec.types.DataType`` names).  Only ``FP32``
    is accepted: the parameter server and the contracts store and update float32 rows."""

    FP32 = "FP32"
    FP16 = "FP16"
    BF16 = "BF16"


def pooling_type(value: object, where: str) -> PoolingType:
    if isinstance(value, PoolingType):
        return value
    if isinstance(value, Enum):  # TorchRec's own PoolingType: same member names
        value = value.value
    if isinstance(value, str) and value.lower() in POOLINGS:
        return PoolingType(value.upper())
    choices = ", ".join([*(f"PoolingType.{p.name}" for p in PoolingType), *map(repr, POOLINGS)])
    raise ValueError(f"{where}: pooling {value!r}: must be one of {choices}")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int_field(where: str, key: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{where}: {key} {value!r}: expected an integer")
    if not low <= value <= high:
        raise ValueError(f"{where}: {key} {value}: must be in {low}..{high}")
    return int(value)


def _positive(where: str, key: str, value: object) -> float:
    if not _is_number(value) or not math.isfinite(value) or value <= 0:  # type: ignore[operator,arg-type]
        raise ValueError(f"{where}: {key} {value!r}: must be a positive finite number")
    return float(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class EmbeddingBagConfig:
    """One embedding table whose bags are pooled, in TorchRec's field names and order.

    Args:
        num_embeddings: the table's id range: ids must lie in ``[0, num_embeddings)``; 0 keeps
            raw int64 ids (negative ones read as unsigned) in a lazy table, of any size.
        embedding_dim: the rows' width (1 .. 65536).
        name: the table's unique name; it keys the rows' first-touch values
            (``contracts.row_init(..., table=name)``) and names the table's files in a job.
        data_type: ``DataType.FP32`` (the only storage type of the parameter server).
        feature_names: the features this table serves (>= 1, unique); features that share a
            table share its rows.
        weight_init_max, weight_init_min: TorchRec's init range; rows start uniform in
            ``[-s, s)`` (``row_init``), so they must be symmetric (``min == -max``), and ``s``
            is ``init_scale``.  Default ``1/sqrt(embedding_dim)``, TorchRec's default too.
        pooling: ``PoolingType.SUM`` / ``MEAN``, TorchRec's own ``PoolingType``, or the
            strings ``"sum"`` / ``"mean"`` (any case), held as our ``PoolingType``.
        optimizer: the table's row optimizer, one of ``common.tables.OPTIMIZERS``
            (``"sgd"``, ``"rowwise_adagrad"``, ``"adagrad"``), applied on the parameter server
            or, outside a job, by :meth:`EmbeddingBagCollection.sparse_step`.
        lr: the table's learning rate (a job's ``--sparse-lr`` unless its job file says).
        init_scale: ``s`` above; 0 takes it from ``weight_init_max`` or the default.
        seed: ``row_init``'s seed; None: the job's ``--seed`` (0 outside a job).
        admit_after, expire_after: the parameter server's admission and expiry rules
            (0: off), as a job file's.
        eps: Adagrad's epsilon (only the ``"adagrad"`` optimizer reads it).

    Bad values raise a ``ValueError`` that names the table and the field.

    Example::

        table = EmbeddingBagConfig(
            num_embeddings=0, embedding_dim=16, name="items",
            feature_names=["clicked", "bought"], pooling="mean", optimizer="rowwise_adagrad",
        )
    """

    num_embeddings: int
    embedding_dim: int
    name: str = ""
    data_type: DataType = DataType.FP32
    # A list or tuple, as TorchRec's takes; held as a tuple (a frozen config is hashable).
    feature_names: Sequence[str] = field(default_factory=tuple)
    weight_init_max: float | None = None
    weight_init_min: float | None = None
    pooling: PoolingType = PoolingType.SUM
    # Ours: a [[tables]] entry's keys (cpu_dist/common/job_file.py TABLE_KEYS), but
    # cache_capacity, which sizes a job's worker-side cache and is not the table's.
    optimizer: str = OPTIMIZERS[0]
    lr: float = DEFAULT_LR
    init_scale: float = 0.0
    seed: int | None = None
    admit_after: int = 0
    expire_after: int = 0
    eps: float = DEFAULT_EPS

    def __post_init__(self) -> None:
        name = self.name
        where = (
            f"EmbeddingBagConfig {name!r}"
            if isinstance(name, str) and name
            else ("EmbeddingBagConfig")
        )
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ValueError(
                f"{where}: name {name!r}: must be 1-128 letters, digits, '_', '-' or '.', not "
                "starting with '.' (every table needs a unique name; it keys the rows' init)"
            )
        set_ = object.__setattr__
        _int_field(where, "num_embeddings", self.num_embeddings, 0, MAX_NUM_EMBEDDINGS)
        _int_field(where, "embedding_dim", self.embedding_dim, 1, MAX_DIM)
        data_type: object = self.data_type
        if isinstance(data_type, Enum):  # TorchRec's own DataType: same member names
            data_type = data_type.value
        if data_type != DataType.FP32.value:
            raise ValueError(
                f"{where}: data_type {self.data_type!r}: only DataType.FP32 (the parameter "
                "server stores float32 rows)"
            )
        set_(self, "data_type", DataType.FP32)
        features = self.feature_names
        if isinstance(features, str) or not all(isinstance(f, str) and f for f in features):
            raise ValueError(f"{where}: feature_names {features!r}: expected a list of names")
        features = tuple(features)
        if not features:
            raise ValueError(f"{where}: feature_names: empty (a table serves >= 1 feature)")
        twice = sorted({f for f in features if features.count(f) > 1})
        if twice:
            raise ValueError(f"{where}: feature_names: {', '.join(map(repr, twice))} listed twice")
        set_(self, "feature_names", features)
        set_(self, "pooling", pooling_type(self.pooling, where))
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"{where}: optimizer {self.optimizer!r}: must be one of "
                f"{', '.join(map(repr, OPTIMIZERS))}"
            )
        set_(self, "lr", _positive(where, "lr", self.lr))
        set_(self, "eps", _positive(where, "eps", self.eps))
        if self.eps != DEFAULT_EPS and self.optimizer != "adagrad":
            raise ValueError(
                f"{where}: eps: only the adagrad optimizer reads it (this table's is "
                f"{self.optimizer})"
            )
        _int_field(where, "admit_after", self.admit_after, 0, _UINT32)
        _int_field(where, "expire_after", self.expire_after, 0, _UINT32)
        if self.seed is not None:
            _int_field(where, "seed", self.seed, 0, 2**64 - 1)
        set_(self, "init_scale", self._scale(where))

    def _scale(self, where: str) -> float:
        """``init_scale`` from itself, ``weight_init_max/min`` or the default, checked to
        agree: ``row_init`` draws from ``[-s, s)``, so TorchRec's range must be symmetric."""
        hi, lo = self.weight_init_max, self.weight_init_min
        scale = self.init_scale
        if not _is_number(scale) or not math.isfinite(scale) or scale < 0:
            raise ValueError(f"{where}: init_scale {scale!r}: must be a positive finite number")
        if hi is not None or lo is not None:
            if hi is None or lo is None:
                raise ValueError(
                    f"{where}: weight_init_max and weight_init_min: give both or neither"
                )
            top = _positive(where, "weight_init_max", hi)
            if not _is_number(lo) or float(lo) != -top:
                raise ValueError(
                    f"{where}: weight_init_min {lo!r}: must be -weight_init_max ({-top!r}): "
                    "rows start uniform in [-init_scale, init_scale)"
                )
            if scale and float(scale) != top:
                raise ValueError(
                    f"{where}: init_scale {scale!r} and weight_init_max {top!r} disagree"
                )
            return top
        return float(scale) if scale else default_init_scale(self.embedding_dim)

    # TorchRec's accessors.
    def get_weight_init_max(self) -> float:
        return self.init_scale

    def get_weight_init_min(self) -> float:
        return -self.init_scale

    def num_features(self) -> int:
        return len(self.feature_names)

    def to_table_config(self) -> TableConfig:
        """The job's view of this table (``[[tables]]``'s keys; the seed is the job's)."""
        return TableConfig(
            name=self.name,
            dim=self.embedding_dim,
            features=tuple(self.feature_names),
            num_embeddings=self.num_embeddings,
            optimizer=self.optimizer,
            lr=self.lr,
            init_scale=self.init_scale,
            admit_after=self.admit_after,
            expire_after=self.expire_after,
            eps=self.eps,
            pooling=self.pooling.mode,
        )

    @classmethod
    def from_table_config(cls, table: TableConfig, seed: int | None = None) -> EmbeddingBagConfig:
        """A job's table (a job file's ``[[tables]]`` entry) as an EmbeddingBagConfig."""
        return cls(
            num_embeddings=table.num_embeddings,
            embedding_dim=table.dim,
            name=table.name,
            feature_names=tuple(table.features),
            pooling=pooling_type(table.pooling, f"table {table.name!r}"),
            optimizer=table.optimizer,
            lr=table.lr,
            init_scale=table.init_scale,
            seed=seed,
            admit_after=table.admit_after,
            expire_after=table.expire_after,
            eps=table.eps,
        )

    def spec(self, seed: int = 0) -> dict[str, Any]:
        """The shard's spec of this table (``TableConfig.spec``); ``seed`` stands where the
        config's own is None."""
        return self.to_table_config().spec(seed if self.seed is None else self.seed)


def configs_of(tables: JobTables, seed: int | None = None) -> list[EmbeddingBagConfig]:
    """A job's tables (``cfg.tables``, from its flags or job file) as EmbeddingBagConfigs, in
    declaration order."""
    return [EmbeddingBagConfig.from_table_config(t, seed) for t in tables.tables]


def job_tables_of(
    configs: list[EmbeddingBagConfig] | tuple[EmbeddingBagConfig, ...],
    data_features: tuple[str, ...] | None = None,
) -> JobTables:
    """EmbeddingBagConfigs as a job's :class:`JobTables` (it refuses two tables of one name
    and a feature in two tables); ``data_features``: the data's feature order (default: the
    tables' features in declaration order)."""
    tables = tuple(c.to_table_config() for c in configs)
    if data_features is None:
        data_features = tuple(f for t in tables for f in t.features)
    return JobTables(tables, data_features=data_features)
