"""A user's own Python file (``path/to/file.py:NAME`` in ``--model``, ``--metric``), loaded as a
module under a name of its own: one per (resolved path, content), so the same file given twice
is one module and an edited file a new one, and ``dataclasses`` and pickling can look the
module up in ``sys.modules`` while it runs."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType


class UserFileError(Exception):
    """Why the file cannot be loaded; the caller prefixes what named it (flag, spec)."""


def is_file_target(target: str) -> bool:
    """``target`` names a file (``.py``, or a path), not a dotted module."""
    return target.endswith(".py") or "/" in target or "\\" in target


def load_user_file(target: str, kind: str) -> ModuleType:
    """The module of the file ``target``, loaded once under ``cpu_dist_user_<kind>_...``;
    UserFileError when it is missing, not a file, not Python, or raises as it runs."""
    path = Path(target)
    if not path.is_file():
        why = "is not a file" if path.exists() else "does not exist"
        raise UserFileError(f"{target} {why} (resolved: {path.resolve()})")
    resolved = str(path.resolve())
    digest = hashlib.sha256(resolved.encode() + b"\0" + path.read_bytes()).hexdigest()[:16]
    stem = re.sub(r"\W", "_", path.stem)
    name = f"cpu_dist_user_{kind}_{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    found = importlib.util.spec_from_file_location(name, resolved)
    if found is None or found.loader is None:
        raise UserFileError(f"{target} cannot be loaded as Python")
    module = importlib.util.module_from_spec(found)
    sys.modules[name] = module  # before exec: dataclasses and pickling look themselves up
    try:
        found.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise UserFileError(f"loading {target} failed: {type(exc).__name__}: {exc}") from exc
    return module
