"""A bundle is published by swapping a link (``common.bundle_link``): a process killed at any
file-system call of the swap leaves the old bundle or the new one at the path, never neither;
the superseded version is removed; a user's own link is followed; a plain directory of an
older export is exchanged for the link in one step."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cpu_dist.common.bundle_link import (
    _exchange,
    bundle_path,
    check_bundle_dir,
    current_version,
    is_version_link,
    new_version,
    publish,
)
from cpu_dist.common.files import EXPORT_FORMAT, OutputError, is_export_bundle

pytestmark = pytest.mark.timeout(120)


def fill(d: Path, tag: str) -> Path:
    """A minimal bundle: its manifest, tagged."""
    (d / "manifest.json").write_text(json.dumps({"format": EXPORT_FORMAT, "tag": tag}))
    return d


def tag(out: Path) -> str | None:
    """The tag of the bundle at ``out`` as a reader finds it (None: nothing there)."""
    try:
        return json.loads((current_version(out) / "manifest.json").read_text())["tag"]
    except FileNotFoundError:
        return None


def siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir())


def test_each_export_swaps_the_link_and_removes_the_version_it_replaced(tmp_path):
    out = tmp_path / "bundle"
    v1 = fill(new_version(out), "one")
    publish(v1, out, is_export_bundle)
    assert is_version_link(out) and tag(out) == "one"
    assert siblings(out) == sorted(["bundle", v1.name])
    v2 = fill(new_version(out), "two")
    publish(v2, out, is_export_bundle)
    assert tag(out) == "two" and siblings(out) == sorted(["bundle", v2.name])
    check_bundle_dir(out, "--export")  # our link: an earlier bundle
    shutil.rmtree(v2)  # a dangling link of ours is replaced as well
    check_bundle_dir(out, "--export")
    publish(fill(new_version(out), "three"), out, is_export_bundle)
    assert tag(out) == "three" and len(siblings(out)) == 2


def test_a_users_own_link_is_followed_and_a_plain_directory_exchanged(tmp_path):
    if not _exchange(*(Path(p) for p in (tmp_path, tmp_path))):
        pytest.skip("no renameat2(RENAME_EXCHANGE) on this file system")
    real = tmp_path / "scratch" / "model"
    real.mkdir(parents=True)
    fill(real, "old")  # an export of before links: a plain directory
    (tmp_path / "model").symlink_to(real)
    out = bundle_path(tmp_path / "model")
    assert out == real
    publish(fill(new_version(out), "new"), out, is_export_bundle)
    assert (tmp_path / "model").resolve().parent == real.parent  # the user's link kept
    assert is_version_link(real) and tag(tmp_path / "model") == "new"
    assert len(siblings(real)) == 2  # the old plain directory is gone
    other = tmp_path / "scratch" / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    with pytest.raises(OutputError, match="refusing to write an export bundle"):
        check_bundle_dir(other, "--export")


# A child publishes the version ".b.v-new" over ``out`` and is killed (os._exit) just before,
# or just after, its k-th file-system call; the parent then reads what is at the path.
CHILD = """
import os, shutil, sys
from pathlib import Path
import cpu_dist.common.bundle_link as bl
from cpu_dist.common.files import is_export_bundle
out, k, after = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "after"
calls = [0]
def crashing(fn):
    def call(*a, **kw):
        calls[0] += 1
        if calls[0] == k and not after:
            os._exit(3)
        r = fn(*a, **kw)
        if calls[0] == k:
            os._exit(3)
        return r
    return call
for name in ("replace", "rename", "symlink", "rmdir"):
    setattr(os, name, crashing(getattr(os, name)))
bl._exchange = crashing(bl._exchange)
bl.fsync_dir = crashing(bl.fsync_dir)
shutil.rmtree = crashing(shutil.rmtree)
bl.publish(out.with_name(".b.v-new"), out, is_export_bundle)
"""


@pytest.mark.parametrize("start", ["missing", "link", "plain"])
def test_a_crash_at_any_call_leaves_the_old_bundle_or_the_new_one(tmp_path, start):
    if start == "plain" and not _exchange(tmp_path, tmp_path):
        pytest.skip("no renameat2(RENAME_EXCHANGE) on this file system")
    seen, k = set(), 1
    while True:
        for after in ("before", "after"):
            root = tmp_path / f"{k}-{after}"
            root.mkdir()
            out = root / "b"
            if start == "link":
                publish(fill(new_version(out), "old"), out, is_export_bundle)
            elif start == "plain":
                out.mkdir()
                fill(out, "old")
            (root / ".b.v-new").mkdir()
            fill(root / ".b.v-new", "new")
            proc = subprocess.run(
                [sys.executable, "-c", CHILD, str(out), str(k), after],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert proc.returncode in (0, 3), proc.stderr
            got = tag(out)
            want = {"new"} if start == "missing" else {"old", "new"}
            if start == "missing":
                want.add(None)  # nothing was there before
            assert got in want, (k, after, got, siblings(out))
            seen.add(got)
            if proc.returncode == 0:  # no k-th call: the publish ran to its end
                assert got == "new" and siblings(out) == [".b.v-new", "b"]
                assert seen >= {"new"} and (start == "missing" or "old" in seen)
                return
        k += 1
        assert k < 20
