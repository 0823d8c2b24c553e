"""What the output-refusal tests put where an output would go, and how they see that it was
left untouched (in process: ``common/tests/test_output_checks.py``; through a real job:
``tests/integration/test_safe_outputs.py``)."""

from __future__ import annotations

import json
from pathlib import Path


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (or ``path`` itself) and its bytes."""
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def dir_of(tmp: Path, name: str, fmt: str | None, *files: str) -> Path:
    """A directory holding ``files`` and, given ``fmt``, a cpu_dist manifest of that format."""
    d = tmp / name
    d.mkdir()
    if fmt is not None:
        (d / "manifest.json").write_text(json.dumps({"format": fmt, "version": 1}))
    for f in files:
        (d / f).write_bytes(b"precious " + f.encode())
    return d
