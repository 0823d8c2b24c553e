"""The job file (``launcher.py --config job.toml``): a job's tables, and any other flag, as data.

Read with the standard library's ``tomllib``.  Its parts:

- ``[[tables]]``: the job's embedding tables (keys: :data:`TABLE_KEYS`), each serving one or
  more of the data's features by name (``cat_0`` ... ``cat_25``); every feature of the data
  is in exactly one table.  A key a table omits takes its default from the flags
  (``--embedding-dim``, ``--sparse-optimizer``, ``--sparse-lr``, ``--init-scale``,
  ``--ps-admit-after``, ``--ps-expire-after``); a key a table gives is never overridden.
- ``[job]``: any other flag under its name with underscores (``batch_size = 4096``), its value
  of the type the flag takes.  A flag given on the command line beats the file, which beats the
  built-in default (:func:`apply_job_defaults` makes the file's values the parser's defaults).
- ``[model]``: ``name`` is ``--model`` (a built-in name, ``PKG.MODULE:FUNC`` or
  ``path/to/file.py:FUNC``); every other key is a keyword argument of the model's factory,
  kept in ``ModelConfig.args`` (:func:`model_args`: scalars as they are, arrays as tuples,
  recursively; a TOML table is refused rather than turned into pairs, so that one spelling
  of an argument exists until a model needs nested ones).
- ``[data]``: which data and how its columns become features (:mod:`cpu_dist.common.job_data`:
  ``kind``, ``path``, ``multi_hot_sizes``, ``multi_hot_distribution`` are flags of their own;
  ``bags``, ``weights``, ``label``, ``dense``).  Whether the features are the data's and the
  data kind can have them is checked with the flags (``job_file_checks``).
- ``[optimizer]``: the dense optimizer, ``name`` (``--dense-optimizer``), ``weight_decay``,
  ``betas`` (``[0.9, 0.999]``), ``momentum``, ``eps`` (:data:`OPTIMIZER_KEYS`; checked as the
  flags are, :mod:`cpu_dist.common.dense_optimizer`).
- A flag that has a key of its own in ``[model]``, ``[data]`` or ``[optimizer]``
  (:data:`SECTION_KEYS`) is refused in ``[job]``; like ``[job]`` values, ``[model] name`` and
  ``[data] kind`` are the parser's defaults, so ``--model`` and ``--data`` on the command
  line beat them.

Every error is a :class:`JobFileError` whose message names the file, the table (its name, or
its place when the name is what is wrong) and the key.  Nothing here knows MPI or the PS: the
launcher parses and checks the file on every rank, as it does the flags, before anything
starts.
"""

from __future__ import annotations

import argparse
import datetime
import keyword
import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cpu_dist.common.config import model_spec_problem
from cpu_dist.common.contracts import default_init_scale
from cpu_dist.common.job_data import DATA_FLAG_KEYS, DataSection, read_data_section
from cpu_dist.common.job_values import JobFileError
from cpu_dist.common.job_values import toml_kind as _kind
from cpu_dist.common.tables import OPTIMIZERS, POOLINGS, JobTables, TableConfig

# The keys of a [[tables]] entry (the issue's, which tests and docs rely on); None: required.
TABLE_KEYS = (
    "name",
    "dim",
    "features",
    "num_embeddings",
    "optimizer",
    "lr",
    "init_scale",
    "admit_after",
    "expire_after",
    "eps",
    "pooling",
    "cache_capacity",
)
SECTIONS = ("job", "tables", "model", "data", "optimizer")
# [optimizer]: the dense optimizer (cpu_dist.common.dense_optimizer), each key a flag's.
OPTIMIZER_KEYS = {
    "name": "dense_optimizer",
    "weight_decay": "weight_decay",
    "betas": "betas",
    "momentum": "momentum",
    "eps": "eps",
}
# The flags that have a key of their own in [model], [data] or [optimizer]: section -> {key:
# flag dest}.  Such a flag is refused in [job], since its home is that key.
SECTION_KEYS: dict[str, dict[str, str]] = {
    "model": {"name": "model"},
    "data": DATA_FLAG_KEYS,
    "optimizer": OPTIMIZER_KEYS,
}
# [model] keys a factory cannot take as keyword arguments: the job passes them positionally.
MODEL_POSITIONAL = ("tables", "dense_features")
# Flags that may not stand in [job]: the job file itself, and the Criteo hashing flags (a
# table's num_embeddings replaces them beside a job file).
NOT_IN_JOB = ("config", "num_embeddings_per_feature", "max_ind_range")
# String flags that take a list on the command line, joined by this separator: in [job] they
# may also be a TOML array.
LIST_FLAGS = {"ps_list": ",", "arch_mlp_bot": "-", "arch_mlp_top": "-"}
# A table's name travels on the wire and names files (a dump's table/<name>/, an export
# bundle's folder per table): letters, digits, '_', '-' and '.', not starting with '.'.
NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")
_UINT32 = 2**32 - 1


@dataclass(frozen=True)
class JobFile:
    """A read job file: ``job`` holds the ``[job]`` values by flag dest, ``tables`` the raw
    ``[[tables]]`` entries (checked by :func:`job_tables` once the flags are known).

    Args:
        path: the file, as ``--config`` named it (every message names it).
        job: ``[job]``'s values by flag dest, as the file gives them.
        tables: the raw ``[[tables]]`` entries.
        model_name: ``[model] name`` (None: the file names no model).
        model_args: ``[model]``'s other keys, sorted (key, value) pairs (:func:`model_args`).
        data: ``[data]`` (:class:`~cpu_dist.common.job_data.DataSection`).
        optimizer: ``[optimizer]``'s values by flag dest (``betas`` as ``"B1,B2"``).
    """

    path: str
    job: Mapping[str, Any]
    tables: tuple[Mapping[str, Any], ...]
    model_name: str | None = None
    model_args: tuple[tuple[str, object], ...] = ()
    data: DataSection = field(default_factory=DataSection)
    optimizer: Mapping[str, Any] = field(default_factory=dict)

    @property
    def data_kind(self) -> str | None:
        """``[data] kind`` (None: not given)."""
        kind = self.data.flag("data")
        return None if kind is None else str(kind)

    @property
    def bags(self) -> tuple[tuple[str, int, int], ...]:
        return self.data.bags

    @property
    def weights(self) -> tuple[str, ...]:
        return self.data.weights


def read_job_file(path: str | os.PathLike[str]) -> JobFile:
    """Parse ``path`` and check its shape (sections, section types, reserved keys)."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise JobFileError(f"--config {name}: no such file") from None
    except IsADirectoryError:
        raise JobFileError(f"--config {name}: is a directory, not a TOML job file") from None
    except OSError as exc:
        raise JobFileError(f"--config {name}: cannot read it: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise JobFileError(f"{name}: not valid TOML: {exc}") from None
    for key in doc:
        if key not in SECTIONS:
            raise JobFileError(
                f"{name}: unknown key {key!r} (a job file has [job], [[tables]], [model], [data] "
                "and [optimizer])"
            )
    job = doc.get("job", {})
    if not isinstance(job, dict):
        raise JobFileError(f"{name}: job must be a table ([job]), not {_kind(job)}")
    tables = doc.get("tables", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise JobFileError(f"{name}: tables must be an array of tables ([[tables]] entries)")
    for section in SECTION_KEYS:
        value = doc.get(section, {})
        if not isinstance(value, dict):
            raise JobFileError(f"{name}: {section} must be a table ([{section}])")
    for key in job:
        for section, keys in SECTION_KEYS.items():
            for own, dest in keys.items():
                if key == dest:
                    raise JobFileError(
                        f"{name}: [job] {key}: has a key of its own, [{section}] {own}; set it "
                        "there"
                    )
    model = doc.get("model", {})
    data = read_data_section(name, doc.get("data", {}))
    return JobFile(
        name,
        dict(job),
        tuple(dict(t) for t in tables),
        model_name=_model_name(name, model["name"]) if "name" in model else None,
        model_args=model_args(name, model),
        data=data,
        optimizer=_optimizer_section(name, doc.get("optimizer", {})),
    )


def _optimizer_section(path: str, section: Mapping[str, Any]) -> dict[str, Any]:
    """``[optimizer]``'s keys by flag dest; ``betas`` may be an array of two numbers (kept
    as the flag's ``"B1,B2"``).  Values are checked as the flags are (``job_defaults``)."""
    out: dict[str, Any] = {}
    for key, value in section.items():
        if key not in OPTIMIZER_KEYS:
            raise JobFileError(
                f"{path}: [optimizer] {key}: unknown key ([optimizer] has "
                f"{', '.join(OPTIMIZER_KEYS)})"
            )
        if key == "betas" and isinstance(value, list):
            if len(value) != 2 or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
            ):
                raise JobFileError(
                    f"{path}: [optimizer] betas (--betas): expected two numbers, [B1, B2]"
                )
            value = ",".join(repr(float(v)) for v in value)
        out[OPTIMIZER_KEYS[key]] = value
    return out


def _model_name(path: str, value: object) -> str:
    """``[model] name``: a model spec, its syntax checked (the factory resolves it)."""
    where = f"{path}: [model] name (--model)"
    if not isinstance(value, str):
        raise JobFileError(f"{where}: expected a string, got {_kind(value)}")
    problem = model_spec_problem(value)
    if problem is not None:
        raise JobFileError(f"{where} {value!r}: {problem}")
    return value


def model_args(path: str, section: Mapping[str, Any]) -> tuple[tuple[str, object], ...]:
    """``[model]``'s keys but ``name``, as ``ModelConfig.args``: (key, value) pairs sorted by
    key, each key a Python identifier (a keyword argument of the factory), each value a TOML
    string, integer, boolean or finite float, or an array of them (a tuple, recursively).

    Refused, naming the file and the key: a TOML table (an inline table or ``[model.KEY]``:
    there is no nested argument yet, so every argument has one spelling), a date or time (no
    JSON form for the checkpoint to record), nan or inf (it never equals itself, so a resume
    could not compare it), and ``tables`` / ``dense_features`` (the job passes those).

    Example::

        model_args("job.toml", {"name": "dcnv2", "low_rank_dim": 8, "widths": [4, [2, 1]]})
        # (("low_rank_dim", 8), ("widths", (4, (2, 1))))
    """
    out = []
    for key in sorted(section):
        if key == "name":
            continue
        where = f"{path}: [model] {key}"
        if not key.isidentifier() or keyword.iskeyword(key):
            raise JobFileError(
                f"{path}: [model] {key!r}: not a Python identifier (each key but name is a "
                "keyword argument of the model's factory)"
            )
        if key in MODEL_POSITIONAL:
            raise JobFileError(
                f"{where}: the job passes the factory its tables and dense_features itself "
                "(from [[tables]] and the data); not a [model] key"
            )
        out.append((key, _model_value(where, section[key])))
    return tuple(out)


def _model_value(where: str, value: object) -> object:
    """One [model] value as ``ModelConfig.args`` holds it (:func:`model_args`)."""
    if isinstance(value, dict):
        raise JobFileError(
            f"{where}: a table is not a model argument (give a string, number, boolean or array)"
        )
    if isinstance(value, list):
        return tuple(_model_value(where, v) for v in value)
    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date
        raise JobFileError(f"{where}: a date or time is not a model argument (give a string)")
    if isinstance(value, float) and not math.isfinite(value):
        raise JobFileError(f"{where}: {value}: a model argument must be a finite number")
    return value


def _flag_value(
    path: str, action: argparse.Action, key: str, value: object, section: str = "job"
) -> object:
    """``value`` as the flag's argparse action would hold it, or JobFileError (naming the
    file, ``[section] key`` and the flag)."""
    flag = max(action.option_strings, key=len)
    where = f"{path}: [{section}] {key} ({flag})"
    if isinstance(action, argparse._StoreTrueAction):
        if not isinstance(value, bool):
            raise JobFileError(f"{where}: expected true or false, got {_kind(value)}")
        return value
    if key in LIST_FLAGS and isinstance(value, list):
        if not value or not all(
            isinstance(v, (str, int)) and not isinstance(v, bool) for v in value
        ):
            raise JobFileError(f"{where}: expected a non-empty array of strings or integers")
        value = LIST_FLAGS[key].join(str(v) for v in value)
    kind = action.type
    if kind is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise JobFileError(f"{where}: expected an integer, got {_kind(value)}")
    elif kind is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise JobFileError(f"{where}: expected a number, got {_kind(value)}")
        value = float(value)
    elif kind is None:
        if not isinstance(value, str):
            raise JobFileError(f"{where}: expected a string, got {_kind(value)}")
    elif isinstance(value, str):  # a flag with its own converter: as argparse calls it
        try:
            value = kind(value)  # type: ignore[operator]
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            raise JobFileError(f"{where}: {exc}") from None
    else:
        raise JobFileError(f"{where}: expected a string, got {_kind(value)}")
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(repr(c) for c in action.choices)
        raise JobFileError(f"{where}: {value!r} is not one of {choices}")
    return value


def job_defaults(job_file: JobFile, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The ``[job]`` values by flag dest, each checked as the flag's action would take it,
    and ``[model] name`` / ``[data] kind`` as ``--model`` / ``--data``."""
    actions = {
        a.dest: a for a in parser._actions if a.option_strings and a.dest != argparse.SUPPRESS
    }
    out: dict[str, Any] = {}
    for key, value in job_file.job.items():
        if key in NOT_IN_JOB:
            why = {
                "config": "a job file cannot name another job file",
            }.get(key, "refused beside a job file: give each table its num_embeddings")
            raise JobFileError(f"{job_file.path}: [job] {key}: {why}")
        action = actions.get(key)
        if action is None or isinstance(action, argparse._HelpAction):
            hint = (
                f" (flags are named with underscores: {key.replace('-', '_')})"
                if "-" in key and key.replace("-", "_") in actions
                else ""
            )
            raise JobFileError(
                f"{job_file.path}: [job] {key}: unknown key: not a flag of launcher.py{hint}"
            )
        out[key] = _flag_value(job_file.path, action, key, value)
    own: list[tuple[str, str, str, object]] = [("model", "name", "model", job_file.model_name)]
    own += [("data", key, dest, job_file.data.flag(dest)) for key, dest in DATA_FLAG_KEYS.items()]
    own += [
        ("optimizer", key, dest, job_file.optimizer.get(dest))
        for key, dest in OPTIMIZER_KEYS.items()
    ]
    for section, key, dest, value in own:
        if value is not None and dest in actions:  # a tool without the flag has no use for it
            out[dest] = _flag_value(job_file.path, actions[dest], key, value, section)
    return out


def apply_job_defaults(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> JobFile | None:
    """Read the ``--config`` that ``argv`` names (if any) and make its ``[job]`` values (and
    ``[model] name``, ``[data] kind``) the parser's defaults, so that the command line still
    beats them.  Returns the job file."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    known, _ = pre.parse_known_args(argv)
    if known.config is None:
        return None
    job_file = read_job_file(known.config)
    parser.set_defaults(**job_defaults(job_file, parser))
    return job_file


@dataclass(frozen=True)
class TableDefaults:
    """What a table that omits a key gets: the flags' values (command line, [job], built-in)."""

    dim: int
    optimizer: str
    lr: float
    init_scale: float | None  # None: 1/sqrt(the table's dim)
    admit_after: int
    expire_after: int


def _entry_label(entry: Mapping[str, Any], index: int) -> str:
    name = entry.get("name")
    if isinstance(name, str) and name:
        return f'[[tables]] "{name}"'
    return f"[[tables]] entry {index + 1}"


def _int_key(where: str, entry: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    if key not in entry:
        return None
    v = entry[key]
    if not isinstance(v, int) or isinstance(v, bool):
        raise JobFileError(f"{where}: {key}: expected an integer, got {_kind(v)}")
    if not low <= v <= high:
        raise JobFileError(f"{where}: {key} {v}: must be in {low}..{high}")
    return int(v)


def _positive_key(where: str, entry: Mapping[str, Any], key: str) -> float | None:
    if key not in entry:
        return None
    v = entry[key]
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise JobFileError(f"{where}: {key}: expected a number, got {_kind(v)}")
    if not (math.isfinite(v) and v > 0):
        raise JobFileError(f"{where}: {key} {v}: must be a positive finite number")
    return float(v)


def _choice_key(
    where: str, entry: Mapping[str, Any], key: str, choices: Sequence[str]
) -> str | None:
    if key not in entry:
        return None
    v = entry[key]
    if not isinstance(v, str) or v not in choices:
        shown = v if isinstance(v, str) else _kind(v)
        raise JobFileError(
            f"{where}: {key} {shown!r}: must be one of {', '.join(repr(c) for c in choices)}"
        )
    return v


def _table(
    path: str,
    index: int,
    entry: Mapping[str, Any],
    defaults: TableDefaults,
    data_features: Sequence[str],
    data_kind: str,
) -> TableConfig:
    where = f"{path}: {_entry_label(entry, index)}"
    for key in entry:
        if key not in TABLE_KEYS:
            raise JobFileError(
                f"{where}: unknown key {key!r} (a table's keys: {', '.join(TABLE_KEYS)})"
            )
    name = entry.get("name")
    if name is None:
        raise JobFileError(f"{where}: name: missing (every table needs a unique name)")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise JobFileError(
            f"{where}: name {name!r}: must be 1-128 letters, digits, '_', '-' or '.', not "
            "starting with '.' (it names the table's files)"
        )
    features = entry.get("features")
    if features is None or features == []:
        raise JobFileError(f"{where}: features: missing or empty (a table serves >= 1 feature)")
    if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
        raise JobFileError(f"{where}: features: expected an array of feature names")
    known = set(data_features)
    for f in features:
        if f not in known:
            raise JobFileError(
                f"{where}: features: {f!r} is not a feature of the data (--data {data_kind} "
                f"has {data_features[0]} ... {data_features[-1]})"
            )
    if len(set(features)) != len(features):
        twice = sorted({f for f in features if features.count(f) > 1})
        raise JobFileError(f"{where}: features: {', '.join(map(repr, twice))} listed twice")
    dim = _int_key(where, entry, "dim", 1, 1 << 16)
    optimizer = _choice_key(where, entry, "optimizer", OPTIMIZERS) or defaults.optimizer
    eps = _positive_key(where, entry, "eps")
    if eps is not None and optimizer != "adagrad":
        raise JobFileError(
            f"{where}: eps: only the adagrad optimizer reads it (this table's is {optimizer})"
        )
    width = dim if dim is not None else defaults.dim
    scale = _positive_key(where, entry, "init_scale")
    if scale is None:
        scale = defaults.init_scale or default_init_scale(width)
    admit = _int_key(where, entry, "admit_after", 0, _UINT32)
    expire = _int_key(where, entry, "expire_after", 0, _UINT32)
    num = _int_key(where, entry, "num_embeddings", 0, 2**63 - 1)
    lr = _positive_key(where, entry, "lr")
    return TableConfig(
        name=name,
        dim=width,
        features=tuple(features),
        num_embeddings=num or 0,
        optimizer=optimizer,
        lr=lr if lr is not None else defaults.lr,
        init_scale=scale,
        admit_after=admit if admit is not None else defaults.admit_after,
        expire_after=expire if expire is not None else defaults.expire_after,
        eps=eps if eps is not None else TableConfig.eps,
        pooling=_choice_key(where, entry, "pooling", POOLINGS) or TableConfig.pooling,
        cache_capacity=_int_key(where, entry, "cache_capacity", 0, 1 << 31) or 0,
    )


def job_tables(
    job_file: JobFile,
    defaults: TableDefaults,
    data_features: Sequence[str],
    data_kind: str,
    *,
    every_feature: bool = True,
) -> JobTables | None:
    """The job file's tables (None: it declares none, the flags' one table stays).  Every
    feature of the data is in exactly one table (``every_feature=False``, Parquet's: the
    data's features are the columns the tables name, ``data_features`` those they may name,
    in the file's order); names are unique."""
    if not job_file.tables:
        return None
    path = job_file.path
    tables: list[TableConfig] = []
    owner: dict[str, str] = {}
    for i, entry in enumerate(job_file.tables):
        t = _table(path, i, entry, defaults, data_features, data_kind)
        if any(t.name == other.name for other in tables):
            raise JobFileError(
                f'{path}: [[tables]] "{t.name}" (entry {i + 1}): name: another table has this '
                "name (each table needs its own)"
            )
        for f in t.features:
            if f in owner:
                raise JobFileError(
                    f'{path}: [[tables]] "{t.name}": features: {f!r} is already in table '
                    f'"{owner[f]}" (a feature is in one table; features may share a table)'
                )
            owner[f] = t.name
        tables.append(t)
    if not every_feature:
        data_features = [f for f in data_features if f in owner]
    missing = [f for f in data_features if f not in owner]
    if missing:
        shown = ", ".join(repr(f) for f in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise JobFileError(
            f"{path}: [[tables]] features: {len(missing)} feature(s) of the data in no table: "
            f"{shown} (every feature of --data {data_kind} needs a table)"
        )
    return JobTables(tuple(tables), fused=False, data_features=tuple(data_features), source=path)
