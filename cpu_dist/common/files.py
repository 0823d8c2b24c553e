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


# --- outputs that must not destroy what a user typed by mistake ----------------------------
# The ``format`` of each cpu_dist directory's manifest.json, one definition: the export bundle
# (cpu_dist/serving/bundle.py) and the converted layout (cpu_dist/data/layout.py) take theirs
# from here; the checkpoint's (cpu_dist/checkpoint/manifest.py) is held equal by a test.
EXPORT_FORMAT = "cpu_dist-export"
CONVERTED_FORMAT = "cpu_dist-criteo-bin"
CHECKPOINT_FORMAT = "cpu_dist-checkpoint"
_KIND_OF_FORMAT = {
    EXPORT_FORMAT: "an export bundle",
    CONVERTED_FORMAT: "a converted Criteo data directory",
    CHECKPOINT_FORMAT: "a checkpoint step directory",
}


class OutputError(ValueError):
    """An output path that would overwrite something else; the message names the flag."""


def manifest_format(path: Path) -> str | None:
    """The ``format`` field of ``path/manifest.json``; None where there is none, and
    ``"unreadable"`` where the file exists but is not a JSON object."""
    import json

    try:
        m = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return "unreadable"
    fmt = m.get("format") if isinstance(m, dict) else None
    return fmt if isinstance(fmt, str) else "unreadable"


def describe_dir(path: Path) -> str:
    """What a directory looks like, for a refusal: a cpu_dist format or its first entries."""
    fmt = manifest_format(path)
    if fmt in _KIND_OF_FORMAT:
        return _KIND_OF_FORMAT[fmt]
    if (path / "part.json").exists():
        return "a part of a converted Criteo data directory"
    names = sorted(p.name for p in path.iterdir())
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"a directory of {len(names)} entries ({shown})"


def check_output_dir(
    path: str | os.PathLike,
    flag: str,
    kind: str,
    accept: Callable[[Path], bool],
) -> None:
    """Refuses (OutputError) to write ``kind`` to ``path`` unless it is missing, an empty
    directory, or a directory ``accept`` recognises as an earlier output of the same kind."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return
    if not p.is_dir():
        raise OutputError(f"{flag} {path}: is a file, not a directory ({kind} is a directory)")
    if not any(p.iterdir()) or accept(p):
        return
    raise OutputError(
        f"{flag} {path}: refusing to write {kind} into a non-empty directory that is "
        f"{describe_dir(p)}; give a new or empty directory"
    )


def check_output_file(
    path: str | os.PathLike, flag: str, kind: str, accept: Callable[[Path], bool]
) -> None:
    """Refuses (OutputError) to write ``kind`` to ``path`` unless it is missing, empty, or a
    file ``accept`` recognises as an earlier output of the same kind."""
    p = Path(path)
    if p.is_dir():
        what = describe_dir(p)
        raise OutputError(f"{flag} {path}: is a directory ({what}); {kind} is a file")
    if not p.exists() or p.stat().st_size == 0 or accept(p):
        return
    raise OutputError(
        f"{flag} {path}: refusing to overwrite a file that is not {kind}; give a new path "
        "(or remove the file yourself)"
    )


def only_files(path: Path, allowed: Callable[[str], bool]) -> bool:
    """Every file under ``path`` (recursively) has a name ``allowed`` accepts."""
    return all(allowed(f.name) for f in path.rglob("*") if not f.is_dir())


def is_export_bundle(path: Path) -> bool:
    """An export bundle holding nothing else (replacing it loses nothing of the user's)."""
    names = {"manifest.json", "dense.pt", "keys.npy", "rows.npy", ".rows.unsorted.npy"}

    def ours(f: Path) -> bool:
        n, parts = f.name, f.relative_to(path).parts
        if n in names or (n.startswith(".") and ".tmp-" in n):
            return True
        # the copy of a user model's source file (cpu_dist/export: model/<file>.py)
        return len(parts) == 2 and parts[0] == "model" and f.suffix == ".py"

    return manifest_format(path) == EXPORT_FORMAT and all(
        ours(f) for f in path.rglob("*") if not f.is_dir()
    )


def is_tensorboard_dir(path: Path) -> bool:
    """TensorBoard event files only (a new run adds its own file beside the old ones)."""
    return only_files(path, lambda n: "tfevents" in n)


def is_metrics_log(path: Path) -> bool:
    """A JSON-lines metrics log: its first line is a log's header
    (``cpu_dist.common.metrics_log``) or, in a log of an older version, an object with
    ``step`` or ``summary``."""
    import json

    from cpu_dist.common.metrics_log import is_header

    try:
        with open(path, encoding="utf-8") as f:
            first = json.loads(f.readline(1 << 20))
    except (OSError, ValueError):
        return False
    return is_header(first) or (isinstance(first, dict) and ("step" in first or "summary" in first))


def is_state_dump(path: Path) -> bool:
    """A ``--dump-state`` file: an .npz (zip) with a table's keys (``table/<name>/keys``,
    cpu_dist/train/dump.py), or ``sparse_keys`` (a dump written before tables)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            return "sparse_keys.npy" in names or any(
                n.startswith("table/") and n.endswith("/keys.npy") for n in names
            )
    except (OSError, zipfile.BadZipFile):
        return False


# renameat2(2)'s flags (linux/fs.h).
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


def rename2(src: Path, dst: Path, flags: int) -> bool:
    """Linux's ``renameat2(src, dst, flags)``: with RENAME_NOREPLACE a rename that fails with
    FileExistsError where ``dst`` exists (even an empty directory, which ``rename`` replaces);
    with RENAME_EXCHANGE both swapped in one step.  False where the system or the file system
    has no such call (then the caller falls back); any other failure raises OSError."""
    import ctypes
    import errno
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(dst))
