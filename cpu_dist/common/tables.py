"""A job's embedding tables: what each table is (:class:`TableConfig`) and which features it
serves (:class:`JobTables`), in the one shape every part of the job reads.

A job without a job file has one table, ``embedding``, declared by today's flags and keyed by
today's fused keys (``JobTables.fused``): its 26 features do not share rows, and its
``row_init`` and partition hash are today's bit for bit (its salt is 0).  A job file
(``--config``, :mod:`cpu_dist.common.job_file`) declares any number of named tables, each
serving one or more features by name; features that share a table share its rows.

The data's features and their names (``cat_0`` ... ``cat_25``, the flag-declared table's) are
:mod:`cpu_dist.common.features`.

This module is the bottom layer (``cpu_dist.common``): it imports nothing of ours but the
contracts and the features' names, so the launcher's checks, the shards' start-up and the
serving side can all read it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from cpu_dist.common.contracts import TABLE, default_init_scale
from cpu_dist.common.features import CATEGORICAL_FEATURES

# The table optimizers a shard knows (csrc/optimizer.h); the first is the default.
OPTIMIZERS = ("sgd", "rowwise_adagrad", "adagrad")
POOLINGS = ("sum", "mean")
DEFAULT_LR = 0.5  # --lr's default, and so --sparse-lr's (cpu_dist/common/config.py)
DEFAULT_EPS = 1e-8  # Adagrad's
# The keys of a table spec, the dict every shard compares: the proto's TableSpec fields in
# order, as csrc/table_spec.h's ShardTableSpec and _ps.pyi's TableSpec (the bottom layer
# reads neither; cpu_dist/sparse/tests/test_spec_keys.py holds the four together).
SPEC_KEYS = (
    "name",
    "dim",
    "optimizer",
    "init_scale",
    "seed",
    "num_embeddings",
    "admit_after",
    "expire_after",
    "eps",
)


@dataclass(frozen=True)
class TableConfig:
    """One embedding table of a job.

    ``lr`` is the job's learning rate for this table: it travels with each commit, so it is not
    part of the shard's spec (:meth:`spec`).  ``init_scale`` 0 stands for the contract's default
    ``1/sqrt(dim)`` and is replaced by it at construction, so a built TableConfig always holds
    the scale its shards use.  ``num_embeddings`` 0 keeps raw ids; N takes them modulo N (the
    data side, ``cpu_dist/data/keys.py``)."""

    name: str
    dim: int
    features: tuple[str, ...]
    num_embeddings: int = 0
    optimizer: str = OPTIMIZERS[0]
    lr: float = DEFAULT_LR
    init_scale: float = 0.0
    admit_after: int = 0
    expire_after: int = 0
    eps: float = DEFAULT_EPS
    pooling: str = POOLINGS[0]
    # The cache stage's rows of this table, in 64-row units (0: a share of the job's budget,
    # ``CacheConfig.table_units``); a worker's setting, not the shard's spec.
    cache_capacity: int = 0

    def __post_init__(self) -> None:
        if not self.init_scale:
            object.__setattr__(self, "init_scale", default_init_scale(self.dim))
        object.__setattr__(self, "features", tuple(self.features))

    def spec(self, seed: int) -> dict[str, Any]:
        """The shard's spec of this table (the dict ``Server(tables=...)`` and
        ``Client.create_tables`` take): what makes its rows, compared field by field by a
        shard that already holds a table of this name.  ``admit_after`` 1 means off as 0
        does, and is sent as 0 so that both compare equal; ``eps`` is 0 unless the optimizer
        is Adagrad's, which is the only one that reads it."""
        return {
            "name": self.name,
            "dim": int(self.dim),
            "optimizer": self.optimizer,
            "init_scale": float(self.init_scale),
            "seed": int(seed),
            "num_embeddings": int(self.num_embeddings),
            "admit_after": int(self.admit_after) if self.admit_after > 1 else 0,
            "expire_after": int(self.expire_after),
            "eps": float(self.eps) if self.optimizer == "adagrad" else 0.0,
        }

    @property
    def has_rules(self) -> bool:
        """Admission or expiry is on for this table."""
        return self.admit_after > 1 or self.expire_after > 0


@dataclass(frozen=True)
class JobTables:
    """Every table of a job and the features each serves.

    ``fused``: the one table ``embedding`` of a job without a job file, keyed by today's fused
    keys (feature offsets in one key space); otherwise each table is keyed by the features' own
    ids.  ``data_features``: the data's categorical features in column order (the columns of a
    batch's ``keys``); every one is served by exactly one table.  ``source``: the job file the
    tables come from (None: the flags).  An empty ``tables`` is only the placeholder a
    :class:`~cpu_dist.common.config.Config` replaces with the flags' one table."""

    tables: tuple[TableConfig, ...]
    fused: bool = False
    data_features: tuple[str, ...] = CATEGORICAL_FEATURES
    source: str | None = None
    _by_feature: dict[str, TableConfig] = dataclasses.field(
        init=False, repr=False, compare=False, hash=False
    )
    _by_name: dict[str, TableConfig] = dataclasses.field(
        init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(self, "data_features", tuple(self.data_features))
        by_name: dict[str, TableConfig] = {}
        by_feature: dict[str, TableConfig] = {}
        for t in self.tables:
            if t.name in by_name:
                raise ValueError(f"two tables are named {t.name!r}")
            by_name[t.name] = t
            for f in t.features:
                if f in by_feature:
                    raise ValueError(
                        f"feature {f!r} is in table {by_feature[f].name!r} and in {t.name!r}"
                    )
                by_feature[f] = t
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_by_feature", by_feature)

    @property
    def names(self) -> tuple[str, ...]:
        """The tables' names in declaration order (the order of requests and of the model)."""
        return tuple(t.name for t in self.tables)

    def by_name(self, name: str) -> TableConfig:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(
                f"no table named {name!r} (the job's: {', '.join(self.names)})"
            ) from None

    def table_of(self, feature: str) -> TableConfig:
        """The table that serves ``feature``."""
        try:
            return self._by_feature[feature]
        except KeyError:
            raise KeyError(f"feature {feature!r} is in no table of the job") from None

    def columns(self, name: str) -> tuple[int, ...]:
        """The columns of ``data_features`` (of a batch's keys) that table ``name`` serves, in
        the table's feature order."""
        index = {f: i for i, f in enumerate(self.data_features)}
        return tuple(index[f] for f in self.by_name(name).features)

    def specs(self, seed: int) -> list[dict[str, Any]]:
        """Every table's shard spec, in declaration order."""
        return [t.spec(seed) for t in self.tables]

    @property
    def dims(self) -> dict[str, int]:
        return {t.name: t.dim for t in self.tables}

    @property
    def uniform_dim(self) -> int | None:
        """The width every table shares, or None when they differ."""
        widths = {t.dim for t in self.tables}
        return widths.pop() if len(widths) == 1 else None

    def settings(self) -> list[dict[str, Any]]:
        """Every table as a JSON dict (spec keys but ``seed``, plus features, lr, pooling): what
        a checkpoint manifest records of the tables."""
        return [
            {
                **{k: v for k, v in t.spec(0).items() if k != "seed"},
                "features": list(t.features),
                "lr": float(t.lr),
                "pooling": t.pooling,
            }
            for t in self.tables
        ]


# The placeholder of a Config built without tables: it stands for the flags' one table.
FROM_FLAGS = JobTables(())


def flag_table(
    *,
    dim: int,
    optimizer: str,
    lr: float,
    init_scale: float,
    admit_after: int,
    expire_after: int,
    features: tuple[str, ...] = CATEGORICAL_FEATURES,
) -> JobTables:
    """The one fused table ``embedding`` a job without a job file has, declared by the flags."""
    table = TableConfig(
        name=TABLE,
        dim=dim,
        features=features,
        optimizer=optimizer,
        lr=lr,
        init_scale=init_scale,
        admit_after=admit_after,
        expire_after=expire_after,
    )
    return JobTables((table,), fused=True, data_features=features)


def is_finite_positive(value: object) -> bool:
    """A number (not a bool) that is finite and > 0."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
