"""One reading of Linux's ``/proc/PID/stat``: what the checkpoint owner record asks of a
process (alive, a zombie, when it started) and what the progress display asks (its name, its
parent)."""

from __future__ import annotations

import os
from pathlib import Path


def proc_stat(pid: int, proc: str | os.PathLike = "/proc") -> tuple[str, list[str]] | None:
    """``(command name, fields 3...)`` of ``proc``/PID/stat (state first, the parent pid at
    index 1, the start time at index 19); None where it cannot be read.  The name, field 2,
    may hold spaces and ')': it is what stands between the first '(' and the last ')'."""
    try:
        text = (Path(proc) / str(pid) / "stat").read_text()
        return text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 1 :].split()
    except (OSError, ValueError):
        return None
