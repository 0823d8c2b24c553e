"""The ``--metrics-out`` log's format, and the one reader every part of the project uses.

A log is JSON lines.  Its first line is a header ``{"cpu_dist_log": 1, "run": ID}`` naming
the run that writes it (the run id its checkpoints record), so that a ``--resume`` appends
only to its own run's log; logs of older versions have no header and are still read.  Every
other line is a record (``cpu_dist.train.metrics`` lists them).  Readers take the records
through :func:`read_records` (or :func:`read_log`), which skips the header, so no reader
mistakes it for a step.  A last line without its newline that does not parse is a line being
written (a job still running) or torn by a crash: it is left out, not an error.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

HEADER_KEY = "cpu_dist_log"
FORMAT = 1


class MetricsLogError(ValueError):
    """A line of a metrics log is not a JSON object; the message names the file and line."""


def header(run_id: str) -> dict[str, Any]:
    """The first line of a new log: the format and the run that writes it."""
    return {HEADER_KEY: FORMAT, "run": run_id}


def is_header(record: object) -> bool:
    return isinstance(record, dict) and HEADER_KEY in record


@dataclass
class MetricsLog:
    """A log as read: its header's run id (None: a log of an older version, without one),
    its records in file order and each record's line as written (for a rewrite that keeps
    them byte for byte)."""

    run: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def parse_log(text: str, where: str) -> MetricsLog:
    """A log's text (``where``: its path, for messages).  Header lines are left out of the
    records (the first one gives the run); blank lines are skipped."""
    log = MetricsLog()
    rows = text.split("\n")
    for n, line in enumerate(rows, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            if n == len(rows):  # no newline after it: being written, or torn by a crash
                break
            raise MetricsLogError(f"{where}:{n}: not JSON ({exc})") from None
        if not isinstance(record, dict):
            raise MetricsLogError(f"{where}:{n}: not a JSON object")
        if is_header(record):
            if n == 1:
                log.run = str(record.get("run", "")) or None
            continue
        log.records.append(record)
        log.lines.append(line)
    return log


def read_log(path: str | os.PathLike) -> MetricsLog:
    """The log at ``path``: its run and records (:func:`parse_log`)."""
    with open(path, encoding="utf-8") as f:
        return parse_log(f.read(), os.fspath(path))


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of the log at ``path``, in file order, without the header."""
    return read_log(path).records
