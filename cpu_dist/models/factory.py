"""The model factory: a model spec (``--model``, a job file's ``[model] name``) to a module.

A spec is one of

- a built-in name (:data:`BUILTIN_MODELS`: ``dlrm``, the default, and ``dcnv2``);
- ``PKG.MODULE:FUNC``: ``FUNC`` of an importable module (the user's installed package);
- ``path/to/file.py:FUNC``: ``FUNC`` of a Python file loaded by path, under a module name of
  its own (``cpu_dist_user_model_<stem>_<hash>``, outside this package), so a user's model
  needs no installing and two files of one name never collide.

Every one is a factory with the signature ``FUNC(tables: list[EmbeddingBagConfig],
dense_features: int, **args) -> nn.Module``, whose module's ``forward(dense [B,
dense_features], sparse: KeyedJaggedTensor)`` returns logits ``[B]`` (or ``[B, 1]``,
:mod:`cpu_dist.models.outputs`).  :func:`build_model`
calls it and checks what it built: an ``nn.Module`` owning at least one
``EmbeddingBagCollection`` (what a job distributes; the rest is dense) whose tables are the
job's.  Every error is a :class:`ModelError` that names the spec and what is wrong, since a
user typing ``--model`` wants to know which of file, module, function or argument to fix.

:func:`source_sha256` hashes a user model's source file, for the export bundle to record which
code its weights belong to.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cpu_dist.common.config import DEFAULT_LR, ModelError
from cpu_dist.common.tables import OPTIMIZERS
from cpu_dist.common.user_files import UserFileError, is_file_target, load_user_file
from cpu_dist.embeddings import EmbeddingBagConfig, collections_of, foreign

__all__ = [
    "BUILTIN_MODELS",
    "ModelError",
    "ModelSpec",
    "build_model",
    "parse_model_spec",
    "resolve_model",
    "source_sha256",
]

ModelFactory = Callable[..., nn.Module]

# Built-in models: name -> "module:function", imported when asked for (one way to load every
# model, built-in or not); the first is a job's default.
BUILTIN_MODELS: dict[str, str] = {
    "dlrm": "cpu_dist.models.dlrm:dlrm",
    "dcnv2": "cpu_dist.models.dcnv2:dcnv2",
}

_MODULE_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_FUNC_RE = re.compile(r"[A-Za-z_]\w*")
_FORMS = "a built-in name, PKG.MODULE:FUNC or path/to/file.py:FUNC"


@dataclass(frozen=True)
class ModelSpec:
    """A parsed model spec.

    Args:
        spec: the text as given.
        kind: ``"builtin"``, ``"module"`` or ``"file"``.
        target: the module's dotted name, or the file's path (as given).
        func: the factory's name in it.
    """

    spec: str
    kind: str
    target: str
    func: str

    def source_file(self) -> Path | None:
        """The user's source file: the file itself, or the module's file (None for a
        built-in, or a module without one)."""
        if self.kind == "builtin":
            return None
        if self.kind == "file":
            return Path(self.target).resolve()
        try:
            found = importlib.util.find_spec(self.target)
        except (ImportError, ValueError) as exc:
            raise ModelError(
                f"model {self.spec!r}: cannot find module {self.target}: {exc}"
            ) from exc
        if found is None:
            raise ModelError(f"model {self.spec!r}: no module named {self.target!r}")
        return Path(found.origin) if found.origin and Path(found.origin).is_file() else None


def parse_model_spec(spec: str) -> ModelSpec:
    """``spec`` as a :class:`ModelSpec` (syntax only: nothing is imported or read).

    A spec with a ``:`` is a user factory: a file when the part before the last ``:`` ends in
    ``.py`` or holds a path separator, else a dotted module name.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ModelError(f"model {spec!r}: expected {_FORMS}")
    if ":" not in spec:
        if spec not in BUILTIN_MODELS:
            raise ModelError(
                f"model {spec!r}: unknown built-in model (built-in: "
                f"{', '.join(sorted(BUILTIN_MODELS))}); a user model is PKG.MODULE:FUNC or "
                "path/to/file.py:FUNC"
            )
        module, func = BUILTIN_MODELS[spec].split(":")
        return ModelSpec(spec, "builtin", module, func)
    target, func = spec.rsplit(":", 1)
    if not _FUNC_RE.fullmatch(func):
        raise ModelError(f"model {spec!r}: {func!r} is not a function name (expected {_FORMS})")
    if is_file_target(target):
        return ModelSpec(spec, "file", target, func)
    if not _MODULE_RE.fullmatch(target):
        raise ModelError(
            f"model {spec!r}: {target!r} is neither a dotted module name nor a .py file "
            f"(expected {_FORMS})"
        )
    return ModelSpec(spec, "module", target, func)


def _load_file(spec: ModelSpec) -> Any:
    """The file's module, loaded once per (path, content) under a name of its own."""
    try:
        return load_user_file(spec.target, "model")
    except UserFileError as exc:
        raise ModelError(f"model {spec.spec!r}: {exc}") from exc


def _import(spec: ModelSpec) -> Any:
    try:
        return importlib.import_module(spec.target)
    except Exception as exc:
        hint = ""
        missing = getattr(exc, "name", None)
        if isinstance(exc, ModuleNotFoundError) and missing and spec.target.startswith(missing):
            # the module itself (not one it imports) is not on sys.path
            hint = (
                " (install it or put its directory on PYTHONPATH; a file is path/to/file.py:FUNC)"
            )
        raise ModelError(
            f"model {spec.spec!r}: cannot import {spec.target}: {type(exc).__name__}: {exc}{hint}"
        ) from exc


def resolve_model(spec: str) -> ModelFactory:
    """The factory a model spec names (imports the module or loads the file).

    Args:
        spec: ``dcnv2``, ``PKG.MODULE:FUNC`` or ``path/to/file.py:FUNC``.

    Returns:
        ``FUNC``, to be called as ``FUNC(tables, dense_features, **args)``.

    Raises:
        ModelError: unknown built-in (listing them), missing file, module not importable (with
            the cause), no ``FUNC`` there, or ``FUNC`` not callable.

    Example::

        factory = resolve_model("my_models/two_tower.py:build")
    """
    parsed = parse_model_spec(spec)
    module = _load_file(parsed) if parsed.kind == "file" else _import(parsed)
    where = parsed.target
    if not hasattr(module, parsed.func):
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ModelError(
            f"model {spec!r}: {where} has no {parsed.func!r} (its callables: "
            f"{', '.join(public) or 'none'})"
        )
    factory = getattr(module, parsed.func)
    if not callable(factory):
        raise ModelError(
            f"model {spec!r}: {where}:{parsed.func} is a {type(factory).__name__}, not callable"
        )
    return factory


def _check_tables(spec: str, model: nn.Module, tables: Sequence[EmbeddingBagConfig]) -> None:
    """The model's collections hold exactly the job's tables, each once and as declared: the
    job creates its tables on the parameter server and feeds each collection from them."""
    found = collections_of(model)
    if not found:
        raise ModelError(
            f"model {spec!r}: the {type(model).__name__} it built owns no EmbeddingBagCollection "
            "(a job distributes a model's collections: build one from the tables argument)"
        )
    given = {t.name: t for t in tables}
    seen: dict[str, str] = {}
    for where, ebc in found:
        for config in ebc.embedding_bag_configs():
            name = config.name
            if name in seen:
                raise ModelError(
                    f"model {spec!r}: table {name!r} is in collection {seen[name]!r} and in "
                    f"{where!r} (one collection per table)"
                )
            seen[name] = where
            if name not in given:
                raise ModelError(
                    f"model {spec!r}: collection {where!r} holds table {name!r}, which is not "
                    f"one of the job's tables ({', '.join(given)})"
                )
            if config != given[name]:
                changed = ", ".join(
                    f"{f} {getattr(config, f)!r}, the job's {getattr(given[name], f)!r}"
                    for f in EmbeddingBagConfig.__dataclass_fields__
                    if getattr(config, f) != getattr(given[name], f)
                )
                raise ModelError(
                    f"model {spec!r}: collection {where!r} changed table {name!r}: {changed} "
                    "(pass the tables as given)"
                )
    unused = [n for n in given if n not in seen]
    if unused:
        raise ModelError(
            f"model {spec!r}: table {unused[0]!r} is in no EmbeddingBagCollection of the model "
            "(every table the job declares must be used)"
        )


def build_model(
    spec: str,
    tables: Sequence[EmbeddingBagConfig],
    dense_features: int,
    args: Mapping[str, Any] | None = None,
    *,
    seed: int | None = None,
) -> nn.Module:
    """Resolve ``spec`` and build the model: ``FUNC(list(tables), dense_features, **args)``.

    Args:
        spec: see :func:`resolve_model`.
        tables: the job's tables.
        dense_features: the number of dense inputs per sample.
        args: the model's own arguments (a job file's other ``[model]`` keys).
        seed: where given, the model is built under ``torch.manual_seed(seed)`` and the
            caller's torch RNG is left as it was, so every worker and the single-process
            reference build the same dense init (collections draw no torch random numbers).

    Raises:
        ModelError: anything :func:`resolve_model` refuses; an argument the factory does not
            take (the ``TypeError``'s text); an exception while building (its type and text);
            a result that is not an ``nn.Module``, whose ``forward`` cannot be called as
            ``forward(dense, sparse)``, that owns no ``EmbeddingBagCollection``, or
            whose collections do not hold the job's tables exactly once each.

    Example::

        model = build_model("dcnv2", tables, 13, {"low_rank_dim": 64}, seed=0)
    """
    factory = resolve_model(spec)
    arguments = dict(args or {})
    bad_keys = [k for k in arguments if not isinstance(k, str)]
    if bad_keys:
        raise ModelError(f"model {spec!r}: argument names must be strings, got {bad_keys[0]!r}")
    table_list = list(tables)
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C callable: no signature to check first
        signature = None
    if signature is not None:
        try:
            signature.bind(table_list, dense_features, **arguments)
        except TypeError as exc:
            # the TypeError a call would raise, with the spec and what the factory does take
            takes = ", ".join(signature.parameters) or "none"
            raise ModelError(
                f"model {spec!r}: {getattr(factory, '__name__', 'FUNC')}() {exc} (its "
                f"arguments: {takes})"
            ) from exc
    # A TorchRec EmbeddingBagConfig the factory builds a collection from takes our fields
    # (optimizer, lr, ...) from the table of its name (the job's, an export's, a bundle's).
    own = (
        contextlib.nullcontext()
        if foreign.active()
        else foreign.job_table_defaults(OPTIMIZERS[0], DEFAULT_LR, table_list)
    )
    try:
        with own:
            if seed is None:
                model = factory(table_list, dense_features, **arguments)
            else:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed)
                    model = factory(table_list, dense_features, **arguments)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(
            f"model {spec!r}: building it failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(model, nn.Module):
        raise ModelError(
            f"model {spec!r}: the factory returned a {type(model).__name__}, expected an nn.Module"
        )
    _check_tables(spec, model, table_list)
    _check_forward(spec, model)
    return model


def _check_forward(spec: str, model: nn.Module) -> None:
    """``model(dense, sparse)`` must bind: a job calls it so, and a model written for another
    calling convention (``forward(batch)``) is better refused before the first step."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(torch.empty(0), None)
    except TypeError as exc:
        raise ModelError(
            f"model {spec!r}: {type(model).__name__}.forward{signature} cannot be called as "
            f"forward(dense, sparse): {exc}"
        ) from exc


def source_sha256(spec: str) -> str | None:
    """The sha256 (hex) of a user model's source file (the file, or the module's file), for
    the export bundle to record which code its weights belong to; None for a built-in model
    (the package's version names it) or a module without a source file."""
    path = parse_model_spec(spec).source_file()
    if path is None:
        return None
    if not path.is_file():
        raise ModelError(f"model {spec!r}: {path} does not exist")
    return hashlib.sha256(path.read_bytes()).hexdigest()
