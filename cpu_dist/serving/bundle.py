"""The export bundle: a trained model that a plain Python process can score with, without MPI,
a parameter server or the native module.

    DIR/manifest.json   written last: format, version, the model settings (dims, MLP widths,
                        dtype, numbers of dense and sparse features), seed and init scale (so a
                        key the table never held scores with its first-touch row), the data
                        settings that made its keys (kind, --max-ind-range,
                        --num-embeddings-per-feature, --zipf-exponent) and the job's batch
                        size, the steps done (``steps``; version 1 wrote the last step,
                        ``step``), every table (``tables``: its spec, features and rows;
                        version 3), and every file's size and crc32
    DIR/dense.pt        the dense parameters, a torch state dict (``bot.*``, ``top.*``)
    DIR/tables/<name>/keys.npy   int64 [n], sorted ascending, memory-mappable (version 3: a
                        folder per table; versions 1 and 2: DIR/keys.npy, the one table's)
    DIR/tables/<name>/rows.npy   float32 [n, dim of the table], row i belongs to keys[i]

The writer (``cpu_dist.export``) and the reader (``cpu_dist.serving``) share this module.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cpu_dist.common.contracts import TABLE
from cpu_dist.common.files import (
    EXPORT_FORMAT,
    atomic_write,
    check_output_dir,
    file_crc32,
    is_export_bundle,
    replace_dir,
    temp_sibling,
)
from cpu_dist.serving.errors import BundleError

# Version 2 adds "data", version 3 a folder per table ("tables"); versions 1 and 2 (one table,
# keys.npy and rows.npy beside the manifest) are still read.
FORMAT, VERSION = EXPORT_FORMAT, 3
READABLE_VERSIONS = (1, 2, 3)
MANIFEST, DENSE, KEYS, ROWS = "manifest.json", "dense.pt", "keys.npy", "rows.npy"
TABLES_DIR = "tables"


def table_dir(name: str) -> str:
    """A table's folder, relative to the bundle (``tables/<name>``)."""
    return f"{TABLES_DIR}/{name}"


def check_table_name(name: str) -> None:
    """A table's name is a folder of the bundle: one plain path component."""
    if not name or "/" in name or "\\" in name or name.startswith(".") or "\0" in name:
        raise BundleError(f"table name {name!r} cannot be a bundle folder")


@dataclass(frozen=True)
class ModelSpec:
    """What it takes to rebuild the model around the rows."""

    dim: int
    num_dense: int
    num_sparse: int
    bot_mlp: tuple[int, ...]
    top_mlp: tuple[int, ...]
    dtype: str
    seed: int
    init_scale: float
    table: str


@dataclass(frozen=True)
class DataSpec:
    """The data settings that made the bundle's keys, and the job's global batch size (what
    its evaluation batches were cut by); serving applies them and refuses other kinds."""

    kind: str  # --data: "synthetic", or a Criteo file ("criteo" TSV, "criteo-bin" converted)
    max_ind_range: int | None
    num_embeddings_per_feature: tuple[int, ...] | None
    zipf_exponent: float
    batch_size: int

    @property
    def family(self) -> str:
        """A TSV file and its conversion give the same batches: one kind of data."""
        return "synthetic" if self.kind == "synthetic" else "criteo"


def spec_from_dense_state(state: dict[str, torch.Tensor], **settings: Any) -> ModelSpec:
    """The feature counts follow from the dense weights: the bottom MLP's input width is the
    number of dense features, and the top MLP's input is dim + F(F+1)/2 for F sparse ones."""
    dim = int(settings["dim"])
    num_dense = int(state["bot.0.weight"].shape[1])
    pairs = int(state["top.0.weight"].shape[1]) - dim
    num_sparse = int((-1 + (1 + 8 * pairs) ** 0.5) / 2)
    if num_sparse * (num_sparse + 1) // 2 != pairs:
        raise BundleError(f"top MLP input {pairs + dim} does not fit dim {dim}")
    return ModelSpec(
        dim=dim,
        num_dense=num_dense,
        num_sparse=num_sparse,
        **{k: v for k, v in settings.items() if k != "dim"},
    )


def check_bundle_output(out: str | os.PathLike, flag: str) -> None:
    """``out`` may receive a bundle: it is missing, empty, or an earlier bundle (nothing else
    in it), else BundleError naming ``flag``; replacing another kind of directory (converted
    data, a checkpoint) would destroy it."""
    try:
        check_output_dir(out, flag, "an export bundle", is_export_bundle)
    except ValueError as exc:
        raise BundleError(str(exc)) from None


@dataclass(frozen=True)
class TableInfo:
    """A table of a bundle: its name, width, how many rows it holds, and what the manifest
    records of it (the shard's spec and the features it serves: checkpoint manifest
    TABLE_FIELDS; ``seed`` and ``init_scale`` make a row the table never held)."""

    name: str
    dim: int
    rows: int
    record: dict[str, Any] = dataclasses.field(default_factory=dict)


class BundleWriter:
    """Rows arrive in any order (pages of a dump, table by table); ``finish`` sorts each table's
    by key into its ``rows.npy`` through a memory map, so memory stays at 16 bytes per row
    (keys, order) of the biggest table.

    Everything is written into a hidden directory beside ``out`` and renamed into place at the
    end, so ``out`` is never half a bundle; an ``out`` that is not empty or an earlier bundle
    is refused before anything is written (and again before the rename)."""

    def __init__(self, out: Path, tables: list[TableInfo], flag: str = "export") -> None:
        out = Path(os.path.abspath(out))
        check_bundle_output(out, flag)
        names = [t.name for t in tables]
        for name in names:
            check_table_name(name)
        if len(set(names)) != len(names) or not names:
            raise BundleError(f"tables {names}: need one or more, each named once")
        self.final, self.tables = out, {t.name: t for t in tables}
        self.out = temp_sibling(out)
        self._keys: dict[str, np.ndarray] = {}
        self._scratch: dict[str, np.ndarray] = {}
        self.filled = dict.fromkeys(names, 0)
        for t in tables:
            folder = self.out / table_dir(t.name)
            folder.mkdir(parents=True)
            self._keys[t.name] = np.empty(t.rows, dtype=np.int64)
            self._scratch[t.name] = np.lib.format.open_memmap(
                folder / ".rows.unsorted.npy", mode="w+", dtype=np.float32, shape=(t.rows, t.dim)
            )

    def abort(self) -> None:
        """Removes the unfinished bundle (``out`` is left as it was)."""
        import shutil

        shutil.rmtree(self.out, ignore_errors=True)

    def add(self, table: str, keys: np.ndarray, values: np.ndarray) -> None:
        n, total = len(keys), self.tables[table].rows
        at = self.filled[table]
        if at + n > total:
            raise BundleError(f"table {table!r}: more rows than the {total} announced")
        self._keys[table][at : at + n] = keys
        self._scratch[table][at : at + n] = values
        self.filled[table] = at + n

    def _sort_table(self, t: TableInfo) -> None:
        if self.filled[t.name] != t.rows:
            raise BundleError(
                f"table {t.name!r}: {self.filled[t.name]} rows written, {t.rows} announced"
            )
        folder = self.out / table_dir(t.name)
        order = np.argsort(self._keys[t.name], kind="stable")
        keys = self._keys[t.name][order]
        if len(keys) > 1 and not (keys[1:] > keys[:-1]).all():
            raise BundleError(f"table {t.name!r}: a key appears twice in the exported rows")
        np.save(folder / KEYS, keys)
        rows = np.lib.format.open_memmap(
            folder / ROWS, mode="w+", dtype=np.float32, shape=(t.rows, t.dim)
        )
        scratch = self._scratch.pop(t.name)
        for start in range(0, t.rows, 1 << 18):  # gathered in blocks: bounded memory
            block = order[start : start + (1 << 18)]
            rows[start : start + len(block)] = scratch[block]
        rows.flush()
        del rows, scratch
        os.unlink(folder / ".rows.unsorted.npy")
        self._keys.pop(t.name)

    def finish(
        self,
        spec: ModelSpec,
        dense: dict[str, torch.Tensor],
        steps: int,
        data: DataSpec | None = None,
    ) -> None:
        """``steps``: the steps the model has trained (``checkpoint.steps_done``), the number
        checkpoints are named by too."""
        for t in self.tables.values():
            self._sort_table(t)
        buf = io.BytesIO()
        torch.save(dense, buf)
        atomic_write(self.out / DENSE, lambda f: f.write(buf.getbuffer()))
        names = [DENSE]
        for t in self.tables.values():
            names += [f"{table_dir(t.name)}/{KEYS}", f"{table_dir(t.name)}/{ROWS}"]
        files = {}
        for name in names:
            size, crc = file_crc32(self.out / name)
            files[name] = {"bytes": size, "crc32": crc}
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "steps": steps,
            "rows": sum(t.rows for t in self.tables.values()),
            "model": {**dataclasses.asdict(spec)},
            "data": None if data is None else dataclasses.asdict(data),
            "tables": [
                {**t.record, "name": t.name, "dim": t.dim, "rows": t.rows}
                for t in self.tables.values()
            ],
            "files": files,
        }
        text = json.dumps(manifest, indent=1, sort_keys=True)
        atomic_write(self.out / MANIFEST, lambda f: f.write(text.encode()))
        try:
            replace_dir(self.out, self.final, is_export_bundle)
        except ValueError as exc:
            raise BundleError(str(exc)) from None


@dataclass
class BundleTable:
    info: TableInfo
    keys: np.ndarray  # memory-mapped
    rows: np.ndarray  # memory-mapped


@dataclass
class Bundle:
    path: Path
    spec: ModelSpec
    data: DataSpec | None  # None: a version 1 bundle, which did not record it
    steps: int  # steps trained (a version 1 bundle's last step + 1)
    dense: dict[str, torch.Tensor]
    tables: dict[str, BundleTable]  # in the job's order

    def only_table(self) -> BundleTable:
        """The one table of a default job's bundle (the fused table ``spec.table``), which
        is what the serving model scores with; a bundle of several tables, or of another
        one, is refused naming them (a model over named tables comes with the models
        issue)."""
        if list(self.tables) != [self.spec.table] or self.spec.table != TABLE:
            raise BundleError(
                f"bundle {self.path}: holds tables {', '.join(map(repr, self.tables))}; "
                f"serving scores the default job's one table {TABLE!r} (a model over named "
                "tables, with its features' own keys, comes with the models issue)"
            )
        return self.tables[self.spec.table]

    @property
    def keys(self) -> np.ndarray:
        return self.only_table().keys

    @property
    def rows(self) -> np.ndarray:
        return self.only_table().rows


def open_bundle(path: str | Path, check: bool = True) -> Bundle:
    """Reads the manifest and the dense state, maps every table's rows; ``check`` verifies
    every file's size and crc32 first."""
    path = Path(path)
    try:
        m = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError(f"bundle {path}: no {MANIFEST} (not an export, or unfinished)") from None
    except (OSError, ValueError) as exc:
        raise BundleError(f"bundle {path / MANIFEST}: unreadable ({exc})") from None
    if m.get("format") != FORMAT or m.get("version") not in READABLE_VERSIONS:
        raise BundleError(
            f"bundle {path / MANIFEST}: not a {FORMAT} manifest of version "
            f"{', '.join(map(str, READABLE_VERSIONS))} (format {m.get('format')!r}, version "
            f"{m.get('version')!r})"
        )
    for name, entry in m["files"].items():
        if name.startswith("/") or ".." in name.split("/"):
            raise BundleError(f"bundle {path / MANIFEST}: file name {name!r}")
        if check:
            size, crc = file_crc32(path / name)
            if (size, crc) != (entry["bytes"], entry["crc32"]):
                raise BundleError(
                    f"bundle {path / name}: corrupt or truncated ({size} bytes, "
                    f"crc32 {crc:08x}; the manifest says {entry['bytes']}, "
                    f"{entry['crc32']:08x})"
                )
    model = dict(m["model"])
    spec = ModelSpec(
        **{**model, "bot_mlp": tuple(model["bot_mlp"]), "top_mlp": tuple(model["top_mlp"])}
    )
    dense = torch.load(path / DENSE, map_location="cpu", weights_only=True)
    if m["version"] >= 3:
        infos = [
            TableInfo(str(t["name"]), int(t["dim"]), int(t["rows"]), dict(t)) for t in m["tables"]
        ]
        folders = {t.name: path / table_dir(t.name) for t in infos}
    else:  # one table, its arrays beside the manifest
        infos = [TableInfo(spec.table, spec.dim, int(m["rows"]))]
        folders = {spec.table: path}
    tables = {}
    for t in infos:
        check_table_name(t.name)
        keys = np.load(folders[t.name] / KEYS, mmap_mode="r")
        rows = np.load(folders[t.name] / ROWS, mmap_mode="r")
        if keys.shape != (t.rows,) or rows.shape != (t.rows, t.dim):
            raise BundleError(
                f"bundle {folders[t.name]}: arrays of shapes {keys.shape}, {rows.shape} for "
                f"{t.rows} rows of dim {t.dim} (table {t.name!r})"
            )
        tables[t.name] = BundleTable(t, keys, rows)
    d = m.get("data")
    data = None
    if d is not None:
        sizes = d.get("num_embeddings_per_feature")
        data = DataSpec(
            **{**d, "num_embeddings_per_feature": None if sizes is None else tuple(sizes)}
        )
    steps = int(m["steps"]) if "steps" in m else int(m["step"]) + 1  # version 1: the last step
    return Bundle(path, spec, data, steps, dense, tables)
