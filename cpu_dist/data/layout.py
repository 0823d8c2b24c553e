"""The converted Criteo layout on disk: one definition, used by the converter and the reader.

```
DIR/
  manifest.json            written last: the conversion is complete when it exists
  <input>/                 one folder per converted input file (train.txt, day_0, ...)
    labels.u8              uint8   [rows]        0 or 1
    dense.f32              float32 [rows, 13]    missing/negative -> 0, then log1p
    cats.u32               uint32  [rows, 26]    raw categorical values (missing -> 0)
    lines.i64              int64   [rows]        0-based physical line of each row
    part.json              written when the four arrays are complete (fsynced)
```

Arrays are raw little-endian, row-major, without headers: their dtype and shape are here and in
the part record, so ``numpy.memmap`` maps them as they are and a worker reads its rows of a
batch with one slice.  Values are not hashed to table sizes: training applies the hashing
flags (``keys.py``), so one conversion serves any table size.  The line numbers keep the
physical lines of the rows (bad lines skipped leave gaps), so the one-file every-k-th-line
split is the TSV reader's, line for line.

``manifest.json``: ``format`` and ``version`` (a reader refuses any other), the arrays' dtypes,
the key fusion it expects and the default hash size, whether bad lines were skipped, and per
input: its name, source path and size, lines, rows, bad lines, and each array file's size and
zlib crc32.  ``part.json`` holds one input's record and the settings it was made with; the
converter skips an input whose part record matches, and redoes any other.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cpu_dist.common.files import CONVERTED_FORMAT
from cpu_dist.data.keys import CRITEO_DEFAULT_HASH_SIZE
from cpu_dist.data.tsv_parse import NUM_DENSE, NUM_SPARSE

FORMAT = CONVERTED_FORMAT
VERSION = 1
MANIFEST = "manifest.json"
PART = "part.json"
FUSION = "(f << 32) | (value % hash_size_f), applied when training reads the values"


@dataclass(frozen=True)
class ArraySpec:
    name: str
    file: str
    dtype: str
    width: int  # values per row; 0 for a vector

    def shape(self, rows: int) -> tuple[int, ...]:
        return (rows,) if self.width == 0 else (rows, self.width)

    def nbytes(self, rows: int) -> int:
        return rows * max(self.width, 1) * np.dtype(self.dtype).itemsize


ARRAYS = (
    ArraySpec("labels", "labels.u8", "<u1", 0),
    ArraySpec("dense", "dense.f32", "<f4", NUM_DENSE),
    ArraySpec("cats", "cats.u32", "<u4", NUM_SPARSE),
    ArraySpec("lines", "lines.i64", "<i8", 0),
)


class LayoutError(ValueError):
    """A converted directory that cannot be read; the message names the file and the problem."""


def manifest_header(skip_bad_lines: bool) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "num_dense": NUM_DENSE,
        "num_sparse": NUM_SPARSE,
        "arrays": {a.name: {"file": a.file, "dtype": a.dtype, "width": a.width} for a in ARRAYS},
        "hashing": {
            "applied": False,
            "fusion": FUSION,
            "default_hash_size": CRITEO_DEFAULT_HASH_SIZE,
        },
        "skip_bad_lines": skip_bad_lines,
    }


def write_json_atomic(path: Path, obj: dict[str, Any]) -> None:
    """Write under a temporary name, fsync, rename over ``path``, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a complete conversion, checked for format and version."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise LayoutError(
            f"{path}: missing (not a converted Criteo directory, or its conversion did not "
            "finish: run python -m cpu_dist.data.convert again)"
        )
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise LayoutError(f"{path}: unreadable ({e})") from None
    if m.get("format") != FORMAT:
        raise LayoutError(f"{path}: format {m.get('format')!r}, expected {FORMAT!r}")
    if m.get("version") != VERSION:
        raise LayoutError(
            f"{path}: format version {m.get('version')!r}, this reader reads version {VERSION}: "
            "convert the data again with this version"
        )
    if not m.get("inputs"):
        raise LayoutError(f"{path}: no inputs")
    return m


def file_crc32(path: Path, chunk: int = 16 << 20) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while b := fh.read(chunk):
            crc = zlib.crc32(b, crc)
    return crc


def verify(directory: str | os.PathLike) -> list[str]:
    """Every array file's size and crc32 against the manifest; the problems found (none: [])."""
    m = read_manifest(directory)
    problems = []
    for part in m["inputs"]:
        for a in ARRAYS:
            entry = part["files"][a.name]
            p = Path(directory) / part["name"] / a.file
            if not p.is_file():
                problems.append(f"{p}: missing")
                continue
            size = p.stat().st_size
            if size != entry["bytes"]:
                problems.append(f"{p}: {size} bytes, the manifest says {entry['bytes']}")
                continue
            crc = file_crc32(p)
            if crc != entry["crc32"]:
                problems.append(f"{p}: crc32 {crc:08x}, the manifest says {entry['crc32']:08x}")
    return problems
