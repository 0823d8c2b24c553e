"""How an export bundle is published at its path so that a crash at any moment leaves the old
bundle or the new one there, never neither and never half of one.

The path (``--export DIR``, the exporter's ``--output DIR``) is a symbolic link to a hidden
sibling directory that holds one version of the bundle (``.DIR.v-PID-HEX``; the link's target
is that bare name, so the pair moves together).  A new bundle is written whole into a new
sibling, then a fresh link to it is renamed over the path (``os.replace``: one ``rename(2)``,
atomic on every POSIX file system, NFS and Lustre included), and only then is the superseded
version removed.  A crash before the rename leaves the old link and a stray ``.DIR.v-*``
sibling (safe to remove); after it, the new bundle.

A path that is still a plain directory (empty, or a bundle written before links) is swapped
with the new link by Linux's ``renameat2(RENAME_EXCHANGE)``, atomic as well.  Only where the
file system lacks that call (NFS) is a plain directory bundle replaced with two renames, once:
after that the path is a link.

Readers follow the link once (:func:`current_version`), so a bundle opened during an export is
read from one version.  A symbolic link the user made (``model -> /scratch/model``) is not
ours: the bundle is published where it points (:func:`bundle_path`).
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

from cpu_dist.common.files import (
    RENAME_EXCHANGE,
    OutputError,
    check_output_dir,
    fsync_dir,
    is_export_bundle,
    rename2,
)

__all__ = [
    "bundle_path",
    "check_bundle_dir",
    "current_version",
    "is_version_link",
    "new_version",
    "publish",
]

VERSION_MARK = ".v-"
_MAX_LINKS = 40


def is_version_link(path: Path) -> bool:
    """``path`` is a link this module made: its target a bare hidden sibling name with a
    version mark (``.NAME.v-...``)."""
    if not path.is_symlink():
        return False
    target = os.readlink(path)
    return "/" not in target and target.startswith(".") and VERSION_MARK in target


def current_version(path: str | os.PathLike[str]) -> Path:
    """The directory a reader opens: the version ``path`` links to, else ``path`` itself."""
    p = Path(path)
    return p.parent / os.readlink(p) if is_version_link(p) else p


def bundle_path(out: str | os.PathLike[str]) -> Path:
    """Where a bundle for ``out`` is published: ``out`` made absolute, a user's own symbolic
    links followed (not ours: :func:`is_version_link`)."""
    p = Path(os.path.abspath(out))
    for _ in range(_MAX_LINKS):
        if not p.is_symlink() or is_version_link(p):
            return p
        p = Path(os.path.abspath(p.parent / os.readlink(p)))
    raise OutputError(f"{out}: more than {_MAX_LINKS} symbolic links to follow")


def check_bundle_dir(out: str | os.PathLike[str], flag: str) -> None:
    """``out`` may receive a bundle: missing, empty, an earlier bundle (nothing else in it),
    or our link whose version is gone; else OutputError naming ``flag``."""
    p = Path(out)
    if is_version_link(p) and not p.exists():
        return  # a dangling link of ours: nothing of the user's behind it
    check_output_dir(out, flag, "an export bundle", is_export_bundle)


def new_version(out: Path) -> Path:
    """A fresh hidden version directory beside ``out`` (same file system: a link's target)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    version = out.with_name(f".{out.name}{VERSION_MARK}{os.getpid()}-{secrets.token_hex(4)}")
    version.mkdir()
    return version


def _exchange(a: Path, b: Path) -> bool:
    """Swaps ``a`` and ``b`` in one step; False where the file system cannot."""
    return rename2(a, b, RENAME_EXCHANGE)


def _swap(link: Path, out: Path, still_ok: Callable[[Path], bool]) -> Path | None:
    """Puts ``link`` at ``out``; returns what it superseded, to remove (None: nothing)."""
    if out.is_symlink():
        if not is_version_link(out):
            raise OutputError(f"{out}: became another link while the bundle was written")
        old = current_version(out)
        os.replace(link, out)
        return old
    if not out.exists():
        os.replace(link, out)
        return None
    if not out.is_dir() or (any(out.iterdir()) and not still_ok(out)):
        raise OutputError(f"{out}: changed while the bundle was written; left it alone")
    if _exchange(link, out):
        return link  # the old directory now bears the link's name
    if not any(out.iterdir()):
        out.rmdir()  # an empty directory: nothing to lose meanwhile
        os.replace(link, out)
        return None
    # No exchange on this file system: a plain directory bundle, replaced once with two renames.
    old = out.with_name(f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
    os.rename(out, old)
    os.replace(link, out)
    return old


def publish(version: Path, out: Path, still_ok: Callable[[Path], bool]) -> None:
    """Makes the finished ``version`` (:func:`new_version` of ``out``) what ``out`` names,
    atomically (see the module docstring), then removes the version it superseded.  An
    ``out`` that is no longer missing, empty, an earlier bundle (``still_ok``) or our link is
    left alone (OutputError; ``version`` kept)."""
    link = out.with_name(f".{out.name}.link-{os.getpid()}-{secrets.token_hex(4)}")
    os.symlink(version.name, link)
    try:
        old = _swap(link, out, still_ok)
    except BaseException:
        if link.is_symlink():
            link.unlink()
        raise
    fsync_dir(out.parent)
    if old is None or old == version:
        return
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink(missing_ok=True)
