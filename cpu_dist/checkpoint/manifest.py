"""The manifest of one checkpoint: what it holds, where, and checksums.  Written last (and
atomically), so a step directory without a manifest is an unfinished checkpoint and ignored;
one with a manifest must be whole, and every problem with it is an error that names the file."""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cpu_dist.common.files import RENAME_NOREPLACE, atomic_write, file_crc32, fsync_dir, rename2
from cpu_dist.common.setting_flags import setting_flag
from cpu_dist.common.tables import SPEC_KEYS

FORMAT = "cpu_dist-checkpoint"
# 2: shard files may live under the shards' own directories (shard_path); 3: the tables' specs
# (``tables``), shard files of format 3 (every table of a shard in one file)
FORMAT_VERSION = 3
READS_VERSIONS = (1, 2, 3)
# What a manifest records of each table: the shard's spec (cpu_dist/common/tables.py
# SPEC_KEYS) and the features it serves.
TABLE_FIELDS = (*SPEC_KEYS, "features")
MANIFEST = "manifest.json"
DENSE = "dense.pt"
_STEP_DIR = re.compile(r"^step-(\d{8,})$")
# A step directory being written, by run <id>: ``.step-N.tmp-<run id>-<8 hex>``, renamed to
# ``step-N`` once every file and the manifest are in it.
_TEMP_DIR = re.compile(r"^\.step-\d{8,}\.tmp-(.*)-[0-9a-f]{8}$")
# What a job produces once training is complete, in the order it produces them; a checkpoint
# after the last step records those still owed (``Manifest.owed``), and a ``--resume`` that
# finds training complete produces them.
OUTPUTS = {
    "final_eval": "the final evaluation",
    "test": "the test evaluation",
    "dump_state": "--dump-state",
    "export": "--export",
}


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the file and the problem."""


def steps_done(last_step: int) -> int:
    """What checkpoints are numbered by: the count of steps they hold.  A checkpoint taken
    after step t (0-based) holds steps 0..t, so after 10 steps it is ``step-00000010``.  The
    one place that turns a step into that number (the manifest's ``step`` field stays the
    last step, t, as in every manifest written before)."""
    return last_step + 1


def step_dir_name(steps: int) -> str:
    """The step directory of a checkpoint holding ``steps`` steps (``steps_done``).  Older
    checkpoints were named by their last step; they stay readable, as every reader takes
    the step from the manifest, never from the name."""
    return f"step-{steps:08d}"


def shard_file_name(shard: int, num_shards: int) -> str:
    return f"shard-{shard:05d}-of-{num_shards:05d}.bin"


@dataclass
class FileEntry:
    file: str  # relative to the step directory
    bytes: int
    crc32: int  # dense: of the whole file; shard files: of the file's header, which holds
    # the checksum of every partition block (checked by the shard that loads it)
    rows: int = 0
    # Where the shard that loads it finds it, relative to that shard's own --checkpoint-dir,
    # when it is not in the step directory: standalone shards write their files under their
    # own directory as <run id>/step-N/<file>.  Empty: in the step directory (PS ranks of the
    # job write there, their directory being the job's).
    shard_path: str = ""


@dataclass
class Manifest:
    step: int  # the last step whose updates the checkpoint holds
    table: str  # the first table's name (version 3: ``tables`` holds them all)
    dim: int  # the first table's dim
    num_shards: int
    shards: list[FileEntry]
    dense: FileEntry
    config: dict = field(default_factory=dict)
    # The run that wrote it: a fresh run makes one, a resumed run keeps its checkpoint's, so a
    # run prunes only its own checkpoints.
    run_id: str = ""
    # Every table (TABLE_FIELDS), in the job's order; empty in versions 1 and 2, which hold
    # the one table ``table`` of dim ``dim`` (the default job's).
    tables: list[dict] = field(default_factory=list)
    # What the run still owed when it wrote this (OUTPUTS keys; only a checkpoint after the
    # last step owes anything); absent in manifests written before: nothing owed.
    owed: list[str] = field(default_factory=list)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    path: Path | None = None  # the step directory (not stored)

    def to_json(self) -> str:
        d = asdict(self)
        d.pop("path")
        return json.dumps(d, indent=1, sort_keys=True)

    def write(self, step_dir: Path) -> None:
        atomic_write(step_dir / MANIFEST, lambda f: f.write(self.to_json().encode()))
        self.path = step_dir

    def file(self, entry: FileEntry) -> Path:
        assert self.path is not None
        return self.path / entry.file


def read_manifest(step_dir: Path) -> Manifest:
    path = step_dir / MANIFEST
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path}: missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint {path}: corrupt manifest ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: not a {FORMAT} manifest")
    if raw.get("format_version") not in READS_VERSIONS:
        raise CheckpointError(
            f"checkpoint {path}: format version {raw.get('format_version')!r}, "
            f"this build reads versions {', '.join(map(str, READS_VERSIONS))}"
        )
    try:
        m = Manifest(
            step=int(raw["step"]),
            table=str(raw["table"]),
            dim=int(raw["dim"]),
            num_shards=int(raw["num_shards"]),
            shards=[FileEntry(**e) for e in raw["shards"]],
            dense=FileEntry(**raw["dense"]),
            config=dict(raw.get("config", {})),
            run_id=str(raw.get("run_id", "")),
            tables=[dict(t) for t in raw.get("tables", [])],
            owed=list(raw.get("owed", [])),
            format_version=int(raw["format_version"]),
        )
        if any(not isinstance(t.get("name"), str) for t in m.tables):
            raise ValueError("a table without a name")
        if any(o not in OUTPUTS for o in m.owed):
            raise ValueError(f"owed {m.owed!r}, outputs are {', '.join(OUTPUTS)}")
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {path}: corrupt manifest (bad or missing field: {exc})"
        ) from None
    if len(m.shards) != m.num_shards or m.num_shards < 1:
        raise CheckpointError(
            f"checkpoint {path}: corrupt manifest ({len(m.shards)} shard "
            f"files for num_shards {m.num_shards})"
        )
    for e in [*m.shards, m.dense]:
        if "/" in e.file or e.file.startswith("."):
            raise CheckpointError(f"checkpoint {path}: corrupt manifest (file name {e.file!r})")
        parts = e.shard_path.split("/") if e.shard_path else []
        if e.shard_path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise CheckpointError(
                f"checkpoint {path}: corrupt manifest (shard path {e.shard_path!r})"
            )
    m.path = step_dir
    return m


def check_matches(
    m: Manifest,
    *,
    dim: int,
    table: str,
    config: dict,
    must_match: tuple[str, ...],
    tables: list[dict] | None = None,
) -> None:
    """Refuses a checkpoint of other tables, another dimension or model configuration.
    ``tables``: the job's (TABLE_FIELDS dicts, job order); a version 1 or 2 checkpoint holds
    the one table ``table`` of ``dim`` and loads only into a job whose one table that is."""
    where = f"checkpoint {m.path / MANIFEST if m.path else MANIFEST}"
    if tables is not None:
        check_tables(m, tables, where)
    elif m.table != table:
        raise CheckpointError(f"{where}: table {m.table!r}, this job trains {table!r}")
    if tables is None and m.dim != dim:
        raise CheckpointError(f"{where}: embedding dim {m.dim}, this job has dim {dim}")
    for key in must_match:
        if key in m.config and m.config[key] != config.get(key):
            raise CheckpointError(
                f"{where}: {setting_flag(key)} {m.config[key]!r} in the "
                f"checkpoint, {config.get(key)!r} in this job"
            )


def check_tables(m: Manifest, tables: list[dict], where: str) -> None:
    """The job's tables are the checkpoint's: the same names, and per table the same spec and
    features (the first differing field is named).  The learning rates may differ: they
    travel with each commit."""
    if not m.tables:  # version 1 or 2: the one table of the default job
        if [t["name"] for t in tables] != [m.table] or tables[0]["dim"] != m.dim:
            listed = ", ".join(f"{t['name']!r} (dim {t['dim']})" for t in tables)
            raise CheckpointError(
                f"{where}: holds the one table {m.table!r} (dim {m.dim}; format version "
                f"{m.format_version}), this job has {listed}"
            )
        return
    saved = {t["name"]: t for t in m.tables}
    job = {t["name"]: t for t in tables}
    for name in saved:
        if name not in job:
            raise CheckpointError(
                f"{where}: holds table {name!r}, which this job does not declare (its tables: "
                f"{', '.join(job)})"
            )
    for name, t in job.items():
        if name not in saved:
            raise CheckpointError(f"{where}: has no table {name!r} (it holds {', '.join(saved)})")
        for key in TABLE_FIELDS:
            a, b = saved[name].get(key), t.get(key)
            if key == "features" and a is not None:
                a, b = list(a), list(b or [])
            if a != b:
                raise CheckpointError(
                    f"{where}: table {name!r}: {key} {a!r} in the checkpoint, {b!r} in this job"
                )


def shard_load_paths(m: Manifest) -> list[str]:
    """The shard files as the shards that load them name them: relative to their own
    checkpoint directory (``shard_path``), or the step directory's files under the job's."""
    assert m.path is not None
    return [e.shard_path or f"{m.path.name}/{e.file}" for e in m.shards]


def check_files(m: Manifest) -> None:
    """Every file of the step directory is there with its size; the dense file's checksum
    matches.  (Shard files' contents, and the files under the shards' own directories, are
    checked by the shards that load them.)"""
    for e in [*(e for e in m.shards if not e.shard_path), m.dense]:
        p = m.file(e)
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint {p}: missing") from None
        if size != e.bytes:
            what = "truncated" if size < e.bytes else "too long"
            raise CheckpointError(
                f"checkpoint {p}: {what} ({size} bytes, the manifest says {e.bytes})"
            )
    size, crc = file_crc32(m.file(m.dense))
    if crc != m.dense.crc32:
        raise CheckpointError(
            f"checkpoint {m.file(m.dense)}: corrupt (crc32 {crc:08x}, the "
            f"manifest says {m.dense.crc32:08x})"
        )


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every step directory under root, newest first."""
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out, reverse=True)


def temp_dir_name(name: str, run_id: str) -> str:
    """Where run ``run_id`` writes step directory ``name`` before it is complete (invisible
    to ``step_dirs``, which knows only ``step-N``)."""
    return f".{name}.tmp-{run_id}-{secrets.token_hex(4)}"


def own_temp_dirs(root: Path, run_id: str) -> list[Path]:
    """Run ``run_id``'s unfinished step directories (a crashed attempt's)."""
    if not root.is_dir():
        return []
    return [
        p
        for p in root.iterdir()
        if (m := _TEMP_DIR.match(p.name)) and m.group(1) == run_id and p.is_dir()
    ]


def publish(work: Path, final: Path) -> None:
    """Renames the complete step directory ``work`` to ``final`` only if nothing is there: two
    runs never share a step directory.  ``renameat2(RENAME_NOREPLACE)`` refuses any ``final``,
    in one step; where the file system lacks it, a check then ``rename``, which replaces at
    most an empty directory (nothing of anyone's; a folder with files refuses it)."""
    try:
        if not rename2(work, final, RENAME_NOREPLACE):
            if final.exists() or final.is_symlink():
                raise CheckpointError(_taken(final))
            os.rename(work, final)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
            raise CheckpointError(_taken(final)) from None
        raise
    fsync_dir(final.parent)


def _taken(final: Path) -> str:
    try:
        whose = (
            f"a checkpoint of run {read_manifest(final).run_id or '?'}"
            if (final / MANIFEST).exists()
            else "an unfinished folder of no known run"
        )
    except CheckpointError:
        whose = "a folder whose manifest cannot be read"
    return (
        f"checkpoint {final}: already exists ({whose}); another run writes into "
        f"{final.parent}, or an earlier version left it there: this checkpoint was not written "
        "(remove the folder if no job writes it)"
    )


def find_latest(root: Path) -> Manifest | None:
    """The newest complete checkpoint (one with a manifest); None if there is none.  A
    manifest that exists but cannot be read is an error, not a reason to go back further."""
    for _, d in step_dirs(root):
        if (d / MANIFEST).exists():
            return read_manifest(d)
    return None


def prune(root: Path, keep: int, run_id: str | None = None) -> list[Path]:
    """Removes all but the newest ``keep`` (0: none removed) complete checkpoints of run
    ``run_id`` and the
    run's unfinished step directories (``temp_dir_name``: a crashed attempt's; call it when
    the run writes none).  None: the complete checkpoints of any run, and unfinished
    ``step-N`` directories older than the newest complete one (versions before the temporary
    names wrote into ``step-N``; a run never removes one, as no one can tell whose it is).
    Returns what it removed; the root is fsynced after it."""
    removed, complete = [], 0
    for _, d in step_dirs(root):
        if (d / MANIFEST).exists():
            if run_id is not None and read_manifest(d).run_id != run_id:
                continue  # another run's: not ours to remove
            complete += 1
            if keep == 0 or complete <= keep:
                continue
        elif complete == 0 or run_id is not None:
            continue  # possibly being written right now, and of no known run
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    for d in own_temp_dirs(root, run_id) if run_id is not None else []:
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    if removed:
        fsync_dir(root)
    return removed
