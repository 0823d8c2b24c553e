"""The export bundle: a trained model that a plain Python process can score with, without MPI,
a parameter server or the native module.

    DIR/manifest.json   written last: format, version, the model (``model``: a
                        :class:`~cpu_dist.serving.model_record.ModelRecord`: its spec, factory
                        arguments, dense features, dtype, seed, how the data's features become
                        its features, and a user model's source with its sha256; version 4),
                        the data settings that made its keys (kind, --max-ind-range,
                        --num-embeddings-per-feature, --zipf-exponent, the multi-hot bags and
                        weights; version 5: all the data the job read, :class:`DataSpec`) and
                        the job's batch size, the steps done (``steps``; version
                        1 wrote the last step, ``step``), every table (``tables``: its
                        ``EmbeddingBagConfig`` as ``model_record.table_record``, and its rows;
                        version 3), and every file's size and crc32
    DIR/dense.pt        the dense parameters, a torch state dict (the model's ``state_dict()``
                        without rows: its collections' rows are the tables below)
    DIR/model/<file>.py a ``path/file.py:FUNC`` model's source, copied (version 4)
    DIR/tables/<name>/keys.npy   int64 [n], sorted ascending, memory-mappable (version 3: a
                        folder per table; versions 1 and 2: DIR/keys.npy, the one table's)
    DIR/tables/<name>/rows.npy   float32 [n, dim of the table], row i belongs to keys[i]

DIR is a link to a hidden version directory, swapped atomically by each export
(:mod:`cpu_dist.common.bundle_link`).  Versions 1 to 3 recorded a DLRM's settings
(:class:`ModelSpec`) instead of a model: they are read as the built-in ``dlrm``
(``model_record.legacy_record``).  The writer
(``cpu_dist.export``) and the reader (``cpu_dist.serving``) share this module.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cpu_dist.common.bundle_link import (
    bundle_path,
    check_bundle_dir,
    current_version,
    new_version,
    publish,
)
from cpu_dist.common.features import categorical_names
from cpu_dist.common.files import EXPORT_FORMAT, atomic_write, file_crc32, is_export_bundle
from cpu_dist.serving.errors import BundleError
from cpu_dist.serving.model_record import (
    MODEL_DIR,
    ModelRecord,
    file_sha256,
    legacy_record,
)

# Version 2 adds "data", version 3 a folder per table ("tables"), version 4 the model record
# ("model": any model, a user model's source copied or named), version 5 all the data the job
# read (DataSpec.recorded: its path, Parquet's columns, Criteo's multi-hot sizes; the synthetic
# stream's dense width and cardinalities came later, absent in the first ones); versions 1
# to 3 (a DLRM's settings; 1 and 2: one table, keys.npy and rows.npy beside the manifest) are
# still read.
FORMAT, VERSION = EXPORT_FORMAT, 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
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
    """A DLRM's settings: the model record of versions 1 to 3, and what
    ``export.export_from_client`` still takes (written as ``model_record.legacy_record``)."""

    dim: int
    num_dense: int
    num_sparse: int
    bot_mlp: tuple[int, ...]
    top_mlp: tuple[int, ...]
    dtype: str
    seed: int
    init_scale: float
    table: str


def data_family(kind: str) -> str:
    """Data kinds that give the same keys: a Criteo TSV file and its conversion are one;
    synthetic and Parquet data are each their own."""
    return kind if kind in ("synthetic", "parquet") else "criteo"


@dataclass(frozen=True)
class DataSpec:
    """The data settings that made the bundle's keys, and the job's global batch size (what
    its evaluation batches were cut by); serving applies them and refuses other kinds.

    Version 5 adds everything else the job read (``recorded``): the data's absolute path, the
    TSV reader's ``skip_bad_lines``, Criteo's multi-hot sizes and their distribution, and
    Parquet's columns (the feature columns in file order, the weight column of each weighted
    feature, the label and dense columns), and the synthetic stream's features, dense width
    and cardinalities, so that a bundle scores as it was trained without the job's flags or
    job file."""

    kind: str  # --data: "synthetic", "criteo" (TSV), "criteo-bin" (converted) or "parquet"
    max_ind_range: int | None
    num_embeddings_per_feature: tuple[int, ...] | None
    zipf_exponent: float
    batch_size: int
    # The multi-hot features ((feature, min, max) sorted) and the weighted ones (version 4;
    # DataConfig.bags / weights): serving's batches must have the job's bags.
    bags: tuple[tuple[str, int, int], ...] = ()
    weights: tuple[str, ...] = ()
    # Version 5 (the defaults: what an older bundle reads as; ``recorded`` False).
    recorded: bool = False
    path: str | None = None  # absolute; None: synthetic, or not found when exported
    skip_bad_lines: bool = False
    multi_hot_sizes: tuple[int, ...] | None = None
    multi_hot_distribution: str = "uniform"
    features: tuple[str, ...] = ()  # Parquet's and the synthetic stream's, as DataConfig's
    weight_columns: tuple[tuple[str, str], ...] = ()
    label: str = "label"
    dense: tuple[str, ...] = ()
    # The synthetic stream's dense width and its features of other names' cardinalities
    # (DataConfig.num_dense, .cardinalities).  None: not synthetic data, or not recorded (a
    # bundle written before: 13 dense features, and no cardinalities unless ``features``
    # names a feature other than cat_0 ... cat_25, whose cardinality it does not say).
    num_dense: int | None = None
    cardinalities: tuple[tuple[str, int], ...] | None = None

    @property
    def family(self) -> str:
        return data_family(self.kind)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DataSpec:
        """A manifest's ``data`` (any version: a key it lacks takes its default)."""

        def tup(v: Any) -> tuple[Any, ...] | None:
            return None if v is None else tuple(v)

        return cls(
            **{
                **d,
                "num_embeddings_per_feature": tup(d.get("num_embeddings_per_feature")),
                "bags": tuple((str(f), int(lo), int(hi)) for f, lo, hi in d.get("bags", ())),
                "weights": tuple(str(f) for f in d.get("weights", ())),
                "multi_hot_sizes": tup(d.get("multi_hot_sizes")),
                "features": tuple(str(f) for f in d.get("features", ())),
                "weight_columns": tuple((str(f), str(c)) for f, c in d.get("weight_columns", ())),
                "dense": tuple(str(c) for c in d.get("dense", ())),
                "cardinalities": (
                    None
                    if d.get("cardinalities") is None
                    else tuple((str(f), int(n)) for f, n in d["cardinalities"])
                ),
            }
        )


def check_bundle_output(out: str | os.PathLike, flag: str) -> None:
    """``out`` may receive a bundle: it is missing, empty, or an earlier bundle (nothing else
    in it), else BundleError naming ``flag``; replacing another kind of directory (converted
    data, a checkpoint) would destroy it."""
    try:
        check_bundle_dir(out, flag)
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

    Everything is written into a new hidden version directory beside ``out``, and ``out``, a
    link, is swapped to it at the end (``common.bundle_link.publish``), so ``out`` is the old
    bundle or the new one at any moment, never half of one; an ``out`` that is not empty or an
    earlier bundle is refused before anything is written (and again before the swap)."""

    def __init__(self, out: Path, tables: list[TableInfo], flag: str = "export") -> None:
        check_bundle_output(out, flag)
        out = bundle_path(out)
        names = [t.name for t in tables]
        for name in names:
            check_table_name(name)
        if len(set(names)) != len(names) or not names:
            raise BundleError(f"tables {names}: need one or more, each named once")
        self.final, self.tables = out, {t.name: t for t in tables}
        self.out = new_version(out)
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
        model: ModelRecord | ModelSpec,
        dense: dict[str, torch.Tensor],
        steps: int,
        data: DataSpec | None = None,
    ) -> None:
        """``model``: the model's record (a :class:`ModelSpec`: a DLRM's, recorded as
        ``legacy_record``); a file spec's source is copied from its ``origin`` into
        ``model/``, and refused if it no longer hashes as recorded.  ``steps``: the steps the
        model has trained (``checkpoint.steps_done``), the number checkpoints are named by
        too."""
        if isinstance(model, ModelSpec):
            infos = legacy_tables(model, list(self.tables.values()))
            self.tables = {t.name: t for t in infos}
            model = legacy_record(model, [{**t.record, "name": t.name} for t in infos])
        names = [DENSE]
        if model.source is not None and model.source.kind == "file":
            names.append(self._copy_source(model))
        for t in self.tables.values():
            self._sort_table(t)
        buf = io.BytesIO()
        torch.save(dense, buf)
        atomic_write(self.out / DENSE, lambda f: f.write(buf.getbuffer()))
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
            "model": model.to_json(),
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
            publish(self.out, self.final, is_export_bundle)
        except ValueError as exc:
            raise BundleError(str(exc)) from None

    def _copy_source(self, model: ModelRecord) -> str:
        """Copies a file spec's source into the bundle (``model.source.path``); the copy must
        hash as recorded (the file the job trained with).  Returns its bundle path."""
        src = model.source
        assert src is not None and src.origin is not None
        if not src.path.startswith(f"{MODEL_DIR}/") or ".." in src.path.split("/"):
            raise BundleError(f"model {model.name!r}: source path {src.path!r} is not model/FILE")
        copy = self.out / src.path
        copy.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(src.origin, copy)
        except OSError as exc:
            raise BundleError(
                f"model {model.name!r}: cannot copy its source {src.origin}: {exc}"
            ) from None
        got = file_sha256(copy)
        if got != src.sha256:
            raise BundleError(
                f"model {model.name!r}: {src.origin} has sha256 {got} now, but the job's model "
                f"was built from sha256 {src.sha256}: the file changed during the job"
            )
        return src.path


@dataclass
class BundleTable:
    info: TableInfo
    keys: np.ndarray  # memory-mapped
    rows: np.ndarray  # memory-mapped


@dataclass
class Bundle:
    path: Path  # as the user gave it: what messages name
    model: ModelRecord
    data: DataSpec | None  # None: a version 1 bundle, which did not record it
    steps: int  # steps trained (a version 1 bundle's last step + 1)
    dense: dict[str, torch.Tensor]
    tables: dict[str, BundleTable]  # in the job's order
    version: int = VERSION
    # The directory the files are read from: the version ``path`` links to (an export's
    # hidden ``.DIR.v-...``), else ``path``; None: ``path``.
    files: Path | None = None

    @property
    def root(self) -> Path:
        return self.files if self.files is not None else self.path

    def only_table(self) -> BundleTable:
        """The one table of a one-table bundle (the default job's ``embedding``); a bundle
        of several tables is refused naming them."""
        if len(self.tables) != 1:
            raise BundleError(
                f"bundle {self.path}: holds tables {', '.join(map(repr, self.tables))}, not one "
                "(read bundle.tables[NAME])"
            )
        return next(iter(self.tables.values()))

    @property
    def keys(self) -> np.ndarray:
        return self.only_table().keys

    @property
    def rows(self) -> np.ndarray:
        return self.only_table().rows


def _read_manifest(path: Path, shown: Path) -> dict[str, Any]:
    """``path``'s manifest (``shown``: the path messages name, the user's)."""
    try:
        m = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError(f"bundle {shown}: no {MANIFEST} (not an export, or unfinished)") from None
    except (OSError, ValueError) as exc:
        raise BundleError(f"bundle {shown / MANIFEST}: unreadable ({exc})") from None
    if m.get("format") != FORMAT or m.get("version") not in READABLE_VERSIONS:
        raise BundleError(
            f"bundle {shown / MANIFEST}: not a {FORMAT} manifest of version "
            f"{', '.join(map(str, READABLE_VERSIONS))} (format {m.get('format')!r}, version "
            f"{m.get('version')!r})"
        )
    return m


def _check_files(path: Path, shown: Path, m: dict[str, Any], check: bool) -> None:
    for name, entry in m["files"].items():
        if name.startswith("/") or ".." in name.split("/"):
            raise BundleError(f"bundle {shown / MANIFEST}: file name {name!r}")
        if check:
            try:
                size, crc = file_crc32(path / name)
            except OSError as exc:
                raise BundleError(f"bundle {shown / name}: unreadable ({exc.strerror})") from None
            if (size, crc) != (entry["bytes"], entry["crc32"]):
                raise BundleError(
                    f"bundle {shown / name}: corrupt or truncated ({size} bytes, "
                    f"crc32 {crc:08x}; the manifest says {entry['bytes']}, "
                    f"{entry['crc32']:08x})"
                )


def legacy_tables(spec: ModelSpec, tables: list[TableInfo]) -> list[TableInfo]:
    """The tables of a DLRM's settings (a version 1 to 3 bundle, ``export_from_client``'s
    ``ModelSpec``), each record completed with what the settings say (the seed, the init
    scale, and a lone table's features: the default job's) where it lacks them."""
    out = []
    for t in tables:
        record = {"seed": spec.seed, "init_scale": spec.init_scale, **t.record}
        if "features" not in record and len(tables) == 1:
            record["features"] = list(categorical_names(spec.num_sparse))
        out.append(dataclasses.replace(t, record=record))
    return out


def _legacy_tables(m: dict[str, Any], spec: ModelSpec) -> list[TableInfo]:
    """The tables of a version 1 to 3 manifest (:func:`legacy_tables`)."""
    if m["version"] >= 3:
        raw = [dict(t) for t in m["tables"]]
    else:  # one table, its arrays beside the manifest
        raw = [{"name": spec.table, "dim": spec.dim, "rows": int(m["rows"])}]
    infos = [TableInfo(str(t["name"]), int(t["dim"]), int(t["rows"]), t) for t in raw]
    return legacy_tables(spec, infos)


def open_bundle(path: str | Path, check: bool = True) -> Bundle:
    """Reads the manifest and the dense state, maps every table's rows; ``check`` verifies
    every file's size and crc32 first.  A bundle path that is the export's link is followed
    once: every file is read from the one version it names then, and messages name the path
    as given (the hidden version directory is the export's business)."""
    shown = Path(path)
    path = current_version(path)
    m = _read_manifest(path, shown)
    _check_files(path, shown, m, check)
    where = f"bundle {shown / MANIFEST}"
    if m["version"] >= 4:
        model = ModelRecord.from_json(m["model"], where)
        infos = [
            TableInfo(str(t["name"]), int(t["dim"]), int(t["rows"]), dict(t)) for t in m["tables"]
        ]
    else:
        raw = dict(m["model"])
        spec = ModelSpec(
            **{**raw, "bot_mlp": tuple(raw["bot_mlp"]), "top_mlp": tuple(raw["top_mlp"])}
        )
        infos = _legacy_tables(m, spec)
        model = legacy_record(spec, [t.record for t in infos])
    folders = {t.name: Path(table_dir(t.name)) if m["version"] >= 3 else Path() for t in infos}
    dense = torch.load(path / DENSE, map_location="cpu", weights_only=True)
    tables = {}
    for t in infos:
        check_table_name(t.name)
        keys = np.load(path / folders[t.name] / KEYS, mmap_mode="r")
        rows = np.load(path / folders[t.name] / ROWS, mmap_mode="r")
        if keys.shape != (t.rows,) or rows.shape != (t.rows, t.dim):
            raise BundleError(
                f"bundle {shown / folders[t.name]}: arrays of shapes {keys.shape}, "
                f"{rows.shape} for {t.rows} rows of dim {t.dim} (table {t.name!r})"
            )
        tables[t.name] = BundleTable(t, keys, rows)
    d = m.get("data")
    try:
        data = None if d is None else DataSpec.from_json(d)
    except (TypeError, ValueError) as exc:
        raise BundleError(f"{where}: data record unreadable ({exc})") from None
    steps = int(m["steps"]) if "steps" in m else int(m["step"]) + 1  # version 1: the last step
    return Bundle(shown, model, data, steps, dense, tables, int(m["version"]), path)
