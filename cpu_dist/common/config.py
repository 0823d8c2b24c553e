"""The typed configuration of a job: what the launcher's flags mean once they are checked.

``cpu_dist.common.validate.validate`` turns the command line into one frozen :class:`Config`;
nothing below the launcher sees the ``argparse.Namespace``.  Each section is what one part of
the system needs, so a part can be built (and tested) from its section alone.  The defaults of
:class:`ClientConfig` are the one definition of the client's tuning defaults: the native
client's keyword defaults and its ``.pyi`` stub are tested against them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cpu_dist.common.contracts import default_init_scale
from cpu_dist.common.features import CATEGORICAL_FEATURES
from cpu_dist.common.schedule import LrSchedule
from cpu_dist.common.tables import DEFAULT_LR, FROM_FLAGS, JobTables, flag_table
from cpu_dist.common.user_files import is_file_target

# The built-in models' names (``--model``), the first the default: the keys of
# ``cpu_dist.models.factory.BUILTIN_MODELS``, restated here because the flags' checks must not
# import torch (the two must stay equal; the models' tests can compare them, common's may not
# import the models package).  A spec with ':' is a user's factory.
BUILTIN_MODEL_NAMES = ("dlrm", "dcnv2")


class ModelError(ValueError):
    """A model spec that cannot be resolved or built; the message names the spec.  Defined
    here, not beside the factory, so that a job's error handling (``train/job.py``, which PS
    ranks import) knows it without importing torch."""


# The longest bag a job file's ``[data] bags`` may ask for (ids of one feature in one sample):
# MLPerf's multi-hot Criteo has at most 100 per feature, so 1024 leaves room and keeps one
# batch's ids bounded.
MAX_BAG_LENGTH = 1024

_FUNC_RE = re.compile(r"[A-Za-z_]\w*")
_MODULE_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class ClientConfig:
    """How a worker talks to the PS shards (``cpu_dist.sparse.Client``)."""

    max_keys_per_rpc: int = 8192
    channels: int = 2
    max_message_bytes: int = 64 << 20
    rpc_timeout_s: float = 60.0  # one RPC, including one commit acknowledgement
    # Encoding of pulled rows and pushed gradients on the wire ("none", "fp16", "int8"); the
    # shards keep float32 rows, and evaluation, dumps, exports and checkpoints stay float32.
    compression: Literal["none", "fp16", "int8"] = "none"


@dataclass(frozen=True)
class JobConfig:
    """Who is who in MPI_COMM_WORLD and where the PS shards are."""

    worker_num: int
    num_ps_ranks: int
    ps_list: tuple[str, ...] = ()  # host:port of PS ranks to listen on, or of external shards
    ps_host: str | None = None
    ps_interface: str | None = None
    token_file: str | None = None
    ps_type: str = "local"
    # Train on rows external shards already hold (else such shards stop the job at start).
    reuse_shard_rows: bool = False
    # PS ranks close commit sessions idle this long (a crashed job's); 0: never.
    session_idle_timeout_s: float = 3600.0
    # Workers waiting for each other: the step's barrier, a commit that needs every worker's
    # chunks, the end of the job.  A checkpoint barrier adds the checkpoint's own budget.
    barrier_timeout_s: float = 300.0
    # How much lower a worker's CPU priority (nice) is than the PS ranks on its node: a shard's
    # applies and gathers are short and every worker waits on them (common/threads.py).
    worker_nice: int = 5
    # Each worker's torch threads; 0: OMP_NUM_THREADS, else its share of the node's cores
    # (common/threads.py).
    worker_threads: int = 0

    @property
    def external_shards(self) -> bool:
        """The job uses shards started elsewhere (``--ps_list`` and no PS ranks)."""
        return bool(self.ps_list) and self.num_ps_ranks == 0


@dataclass(frozen=True)
class ModelConfig:
    embedding_dim: int = 64
    bot_mlp: tuple[int, ...] = (512, 256, 64)
    top_mlp: tuple[int, ...] = (512, 256, 1)
    dtype: str = "float32"  # dense parameters; embedding rows are always float32
    # First-touch rows are uniform in [-s, s); the default is the contract's, of the default dim.
    init_scale: float = default_init_scale(embedding_dim)
    # --model: a built-in name (BUILTIN_MODEL_NAMES), PKG.MODULE:FUNC or path/file.py:FUNC;
    # resolved by cpu_dist.models.factory when the job builds its model.
    name: str = BUILTIN_MODEL_NAMES[0]
    # A job file's other [model] keys, the factory's keyword arguments: (key, value) pairs
    # sorted by key, values TOML scalars or (nested) tuples for TOML arrays.
    args: tuple[tuple[str, object], ...] = ()
    # dcnv2's low-rank cross network (TorchRec dlrm_main's --dcn_num_layers, --dcn_low_rank_dim)
    dcn_num_layers: int = 3
    dcn_low_rank_dim: int = 512


@dataclass(frozen=True)
class ShardStorageConfig:
    """How each PS shard keeps its rows (PS ranks of the job; external shards must agree), and
    the step rules of the flag-declared table (a job file's tables carry their own:
    ``Config.tables``)."""

    memory_rows: int = 0  # DRAM tier, rows per shard (0: unbounded); one-table jobs only
    ssd_dir: str | None = None  # RocksDB tier beyond the DRAM budget
    admit_after: int = 0  # a key's gradient is applied from the N-th step containing it
    expire_after: int = 0  # rows not updated for S steps are dropped (0: never)
    # DRAM tier in bytes per shard, across all its tables (values, optimizer state, key and
    # per-row metadata of each row; 0: unbounded)
    memory_bytes: int = 0


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 2048  # global
    # Steps to train.  Before training it is resolved against the data
    # (cpu_dist/data/run_length.py): file data without --max_step trains its --epochs.
    max_step: int = 300
    max_step_given: bool = False  # --max_step was on the command line
    lr: float = DEFAULT_LR
    sparse_lr: float = DEFAULT_LR
    dense_optimizer: str = "sgd"
    # The dense optimizer's torch keyword arguments but lr, resolved (torch's defaults filled
    # in): (name, value) pairs, cpu_dist.common.dense_optimizer.dense_optimizer_args.
    dense_optimizer_args: tuple[tuple[str, object], ...] = (
        ("momentum", 0.0),
        ("weight_decay", 0.0),
    )
    sparse_optimizer: str = "sgd"
    seed: int = 0
    aggregation: str = "ps"  # who sums a step's sparse gradients: "ps" or "collective"
    sparse_sync: str = "pipelined"  # "pipelined", "barrier" or "async"
    max_staleness: int = 2  # async: a read of step t waits only for commit t-1-K
    dense_sync: str = "allreduce"  # "allreduce" or "reduce_scatter" (ZeRO-1)
    # The learning-rate schedule of every rate (dense, sparse, each table): LrSchedule's
    # fields (cpu_dist/common/schedule.py); all 0: constant rates.
    lr_warmup_steps: int = 0
    lr_decay_start: int = 0
    lr_decay_steps: int = 0
    lr_decay_power: float = 2.0
    lr_min: float = 1e-7

    @property
    def schedule(self) -> LrSchedule:
        return LrSchedule(
            self.lr_warmup_steps,
            self.lr_decay_start,
            self.lr_decay_steps,
            self.lr_decay_power,
            self.lr_min,
        )


# --data's choices: the synthetic stream, a Criteo TSV file, a converted Criteo directory, and
# Parquet files (one column per feature, as NVTabular writes them).
DATA_KINDS = ("synthetic", "criteo", "criteo-bin", "parquet")
# --multi-hot-distribution's choices (cpu_dist/data/multi_hot.py).
MULTI_HOT_DISTRIBUTIONS = ("uniform",)


@dataclass(frozen=True)
class DataConfig:
    kind: str = "synthetic"  # one of DATA_KINDS
    path: str | None = None
    skip_bad_lines: bool = False
    zipf_exponent: float = 1.05
    # Criteo hashing (cpu_dist/data/keys.py): per-feature table sizes (TorchRec's name) and a cap
    # on every table (DLRM's); None: 2**32, raw values kept.
    num_embeddings_per_feature: tuple[int, ...] | None = None
    max_ind_range: int | None = None
    # Passes over file data (the synthetic stream is endless); None: as many as --max_step
    # takes (it was given and --epochs was not).
    epochs: int | None = 1
    shuffle: bool = False  # file data: each epoch's batch order drawn from (seed, epoch)
    # A job file's [data] bags: (feature, min, max) sorted by feature, the feature multi-hot
    # with bag lengths uniform in [min, max]; features not named have one id per sample.
    bags: tuple[tuple[str, int, int], ...] = ()
    # A job file's [data] weights: the features whose ids carry a per-id weight, sorted.
    weights: tuple[str, ...] = ()
    # Criteo made multi-hot (--multi-hot-sizes): one bag size per feature; None: one-hot.
    multi_hot_sizes: tuple[int, ...] | None = None
    multi_hot_distribution: str = "uniform"
    # Parquet (--data parquet): the categorical features, in the files' column order (each
    # reads the column of its name; synthetic data: the features its tables name), the
    # weights' (feature, column) pairs, the label column and the dense columns.
    features: tuple[str, ...] = ()
    weight_columns: tuple[tuple[str, str], ...] = ()
    label: str = "label"
    dense: tuple[str, ...] = ()
    # Synthetic data (cpu_dist/data/synthetic.py): the dense width ([data] dense = N) and each
    # feature of another name than cat_0 ... cat_25 with its cardinality, sorted; ``features``
    # then names the job's features in the batch's order (empty: cat_0 ... cat_25, as before).
    num_dense: int = 13
    cardinalities: tuple[tuple[str, int], ...] = ()


# The cache stage's capacity unit (``--optimization-cache-capacity``, a table's
# ``cache_capacity``): rows of a table's width.
CACHE_ROWS_PER_UNIT = 64


@dataclass(frozen=True)
class CacheConfig:
    """The cache stage (``--read-mode bagpipe``); absent when it is off."""

    prescan: bool = False
    # of 64 rows of --embedding-dim: the fused table's size, and a job file's tables' budget
    capacity_units: int = 8192
    plan_window: int = 0
    bypass_below: float = 0.02

    def table_units(self, tables: JobTables, unit_dim: int) -> dict[str, int]:
        """Each table's cache in 64-row units of its own width.

        The budget is what ``capacity_units`` hold at ``unit_dim`` (``--embedding-dim``) in
        float32: the flags' one table gets exactly that.  A job file's table with its own
        ``cache_capacity`` takes it off the budget; the others split what is left by their row
        bytes, so that each caches the same number of rows (whole units, at least one).
        Raises ValueError, naming the tables, where the budget leaves them less than a unit.
        """
        own = {t.name: t.cache_capacity for t in tables.tables if t.cache_capacity}
        rest = [t for t in tables.tables if not t.cache_capacity]
        if not rest:
            return own
        unit_rows = CACHE_ROWS_PER_UNIT
        budget = self.capacity_units * unit_rows * unit_dim * 4
        taken = sum(own[t.name] * unit_rows * t.dim * 4 for t in tables.tables if t.name in own)
        row_bytes = sum(t.dim * 4 for t in rest)
        units = (budget - taken) // (row_bytes * unit_rows)
        if units < 1:
            names = ", ".join(t.name for t in rest)
            raise ValueError(
                f"--optimization-cache-capacity {self.capacity_units} ({budget} bytes: "
                f"{self.capacity_units} units of {unit_rows} rows of --embedding-dim {unit_dim})"
                + (f" less the {taken} bytes of the tables' own cache_capacity" if taken else "")
                + f" leaves less than {unit_rows} rows for each of the tables {names} "
                f"({unit_rows * row_bytes} bytes); raise it or give those tables a "
                "cache_capacity of their own"
            )
        return {t.name: own.get(t.name, int(units)) for t in tables.tables}


@dataclass(frozen=True)
class CheckpointConfig:
    dir: str | None = None
    every: int = 0
    keep: int = 2
    resume: bool = False
    timeout_s: float = 600.0  # one save or restore on a shard


@dataclass(frozen=True)
class OutputConfig:
    metrics_out: str | None = None
    print_freq: int = 10
    eval_every: int = 100
    # Global batches of the eval split each evaluation scores (None: all of it, the last
    # partial batch included; the endless synthetic stream: 4): the periodic ones (every
    # --eval-every steps) and the final one.  --eval-batches N sets both, -1 both to all.
    eval_batches: int | None = 4
    final_eval_batches: int | None = None
    test_batches: int | None = None  # at the end: None = the whole test split, 0 = none
    dump_state: str | None = None
    export: str | None = None  # a serving bundle at the end (cpu_dist.serving.bundle)
    tensorboard: str | None = None
    progress: bool = True
    # Steps whose rows train_auc/train_ne are over (0: none).  Worker 0 ranks them at every
    # logged step: 20 steps of the default 2048 rows take about 7 ms, 100 about 40 ms.
    metric_window: int = 20
    metrics: tuple[str, ...] = ()  # --metric MODULE:CLASS, the user's torchmetrics.Metric
    verbose_summary: bool = False


@dataclass(frozen=True)
class Config:
    job: JobConfig
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    data: DataConfig = DataConfig()
    client: ClientConfig = ClientConfig()
    storage: ShardStorageConfig = ShardStorageConfig()
    cache: CacheConfig | None = None
    checkpoint: CheckpointConfig = CheckpointConfig()
    output: OutputConfig = OutputConfig()
    # The job's embedding tables (cpu_dist/common/tables.py), on every Config.  Left empty
    # (the default) or fused, it is the one fused table "embedding" that the other sections'
    # flags declare (derived again by dataclasses.replace, so it never disagrees with them);
    # a job file's tables are kept as given.
    tables: JobTables = FROM_FLAGS

    def __post_init__(self) -> None:
        if not self.tables.tables or self.tables.fused:
            object.__setattr__(
                self,
                "tables",
                flag_table(
                    dim=self.model.embedding_dim,
                    optimizer=self.train.sparse_optimizer,
                    lr=self.train.sparse_lr,
                    init_scale=self.model.init_scale,
                    admit_after=self.storage.admit_after,
                    expire_after=self.storage.expire_after,
                    features=self.data.features or CATEGORICAL_FEATURES,
                ),
            )

    def settings(self) -> dict[str, Any]:
        """Every setting as ``{"section.field": value}`` with JSON types (tuples as lists, at
        every depth: ``model.args`` is ``[[key, value], ...]``, ``data.bags`` ``[[feature,
        min, max], ...]``), so that a setting read back from a manifest's JSON compares equal
        to the same setting of this Config: what a checkpoint manifest records and compares on
        resume.  The tables are ``tables.fused`` and ``tables.tables`` (a list of
        ``JobTables.settings`` dicts); ``storage`` is recorded under its old section name
        (``_SETTINGS_SECTION``)."""
        out: dict[str, Any] = {}
        for section in dataclasses.fields(self):
            value = getattr(self, section.name)
            key = _SETTINGS_SECTION.get(section.name, section.name)
            if value is None:
                out[key] = None
                continue
            if isinstance(value, JobTables):
                out["tables.fused"] = value.fused
                out["tables.tables"] = value.settings()
                continue
            for f in dataclasses.fields(value):
                v = getattr(value, f.name)
                out[f"{key}.{f.name}"] = _json_value(v)
        return out


# Config sections whose settings keys keep an older name.  ``Config.storage`` was
# ``Config.table``: checkpoint manifests record and compare "table.admit_after" and the rest
# (checkpoint.coordinator.MUST_MATCH, setting_flags), so the recorded keys stay "table.*" and
# checkpoints written before and after the rename compare equal on resume.
_SETTINGS_SECTION = {"storage": "table"}


def _json_value(value: object) -> object:
    """``value`` with every tuple a list, recursively (what a JSON round trip gives back)."""
    if isinstance(value, (tuple, list)):
        return [_json_value(v) for v in value]
    return value


def model_source_problem(spec: str) -> str | None:
    """Why a user model spec's file or top-level package cannot be found, or None: checked by
    the launcher before MPI starts, so that a mistyped path is one line from the first rank,
    not an MPI_ABORT banner per rank once the job has started.

    Only what needs no import: ``path/to/file.py:FUNC``'s file (relative to the working
    directory, as the factory reads it) and ``PKG.MODULE:FUNC``'s top-level package on
    ``sys.path``; submodules, the function and loading it are the factory's to check when the
    job builds its model.  A built-in name, or a spec with bad syntax (``model_spec_problem``
    names that), has no problem here.

    Example::

        assert "does not exist" in model_source_problem("no/such.py:build")
    """
    if ":" not in spec or model_spec_problem(spec) is not None:
        return None
    target = spec.rsplit(":", 1)[0]
    if is_file_target(target):
        path = Path(target)
        if path.is_file():
            return None
        why = "is not a file" if path.exists() else "does not exist"
        return f"{target} {why} (resolved: {path.resolve()})"
    top = target.split(".", 1)[0]
    try:
        found = importlib.util.find_spec(top)  # a top-level name: searched for, not imported
    except (ImportError, ValueError):
        return None  # the factory reports it with the cause
    if found is None:
        return (
            f"no module named {top!r} on the Python path (install it or put its directory on "
            "PYTHONPATH; a file is path/to/file.py:FUNC)"
        )
    return None


def model_spec_problem(spec: object) -> str | None:
    """Why ``spec`` cannot name a model (syntax only: nothing is imported or read), or None.

    The rules of ``cpu_dist.models.factory.parse_model_spec``, which imports torch and so
    cannot run where the flags are checked: a name without ':' must be built in; a user's
    factory is ``PKG.MODULE:FUNC`` or ``path/to/file.py:FUNC``.  Whether the module, file
    and function exist is the factory's to say, when the job builds its model.

    Example::

        assert model_spec_problem("dcnv2") is None
        assert "unknown built-in model" in model_spec_problem("dlmr")
    """
    forms = "a built-in name, PKG.MODULE:FUNC or path/to/file.py:FUNC"
    if not isinstance(spec, str) or not spec.strip():
        return f"expected {forms}"
    if ":" not in spec:
        if spec in BUILTIN_MODEL_NAMES:
            return None
        return (
            f"unknown built-in model (built-in: {', '.join(BUILTIN_MODEL_NAMES)}); a user "
            "model is PKG.MODULE:FUNC or path/to/file.py:FUNC"
        )
    target, func = spec.rsplit(":", 1)
    if not _FUNC_RE.fullmatch(func):
        return f"{func!r} is not a function name (expected {forms})"
    if is_file_target(target):
        return None
    if not _MODULE_RE.fullmatch(target):
        return f"{target!r} is neither a dotted module name nor a .py file (expected {forms})"
    return None
