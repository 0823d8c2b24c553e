"""The refusal every flag check raises (``ConfigError``), and the one conversion of the
job file's and data checks' own errors into it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class ConfigError(ValueError):
    """A flag or flag combination that cannot work; the message names the flag."""


@contextlib.contextmanager
def as_config_error() -> Iterator[None]:
    """The job file's checks (``job_file_checks``) raise JobFileError, the data checks
    (``data_checks``) ValueError: the same message, as every other refusal of the flags."""
    try:
        yield
    except ValueError as exc:  # JobFileError, and the data checks' (Parquet's: ParquetError)
        raise ConfigError(str(exc)) from None
