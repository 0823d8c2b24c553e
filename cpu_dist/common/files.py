"""Crash-safe file writes: a temporary name, flushed and fsynced, then renamed over the final
name, then the directory fsynced, so that a reader sees either the old state or the new file."""

from __future__ import annotations

import os
import secrets
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO

CHUNK = 8 << 20


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> tuple[int, int]:
    """Calls ``write(f)`` on a temporary file next to ``path``, then makes it ``path``.
    Returns (bytes, crc32) of what was written."""
    # A unique temporary name, created exclusively and never through a symlink: two writers
    # (or a stale file from a crashed one) cannot share it.
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        size, crc = file_crc32(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return size, crc


def file_crc32(path: Path) -> tuple[int, int]:
    """(size in bytes, zlib crc32) of a file, read in chunks."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc
