"""What every part of the job file's reader shares: its error, and how a TOML value is named
in a message (``job_file`` reads the file, ``job_data`` its ``[data]`` section)."""

from __future__ import annotations


class JobFileError(ValueError):
    """A job file that cannot be used; the message names the file, the table and the key."""


def toml_kind(value: object) -> str:
    """A TOML value's kind, for messages."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a float ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__
