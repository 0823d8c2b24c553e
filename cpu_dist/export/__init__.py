"""Export a trained model as a serving bundle (:mod:`cpu_dist.serving.bundle`).

Two ways in, one way out: at the end of training (``launcher.py --export DIR``: the job's own
shards are dumped page by page) or from a checkpoint (``python -m cpu_dist.export
CHECKPOINT_DIR --output DIR``: the checkpoint is loaded into a private in-process shard, with
every check a resume makes, and dumped the same way).  Either way the rows stream through a
memory map: no message-size limit, and memory of 16 bytes per row besides one page.

The bundle records the model (:mod:`cpu_dist.serving.model_record`): a job's from its Config
and the model it trained (:func:`export_job`, any model), a checkpoint's from its settings
(checked by rebuilding it and loading its dense state, :func:`check_model`); a user model's
source file is copied into the bundle, a module's path recorded, each with its sha256.
"""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from cpu_dist.checkpoint.manifest import (
    DENSE,
    CheckpointError,
    Manifest,
    check_files,
    find_latest,
    read_manifest,
    shard_load_paths,
    steps_done,
)
from cpu_dist.common.features import CATEGORICAL_FEATURES
from cpu_dist.embeddings import collections_of
from cpu_dist.export.client_rows import PAGE_BYTES, table_rows_on_shards, write_bundle
from cpu_dist.export.job import export_job
from cpu_dist.export.records import data_spec, settings_model_record
from cpu_dist.models.factory import ModelError, build_model
from cpu_dist.serving.bundle import BundleError, DataSpec, ModelSpec, check_bundle_output
from cpu_dist.serving.model_record import ModelRecord, table_config
from cpu_dist.serving.rows import BundleRows
from cpu_dist.sparse import Client, Server

__all__ = [
    "PAGE_BYTES",
    "check_model",
    "data_spec",
    "export_checkpoint",
    "export_from_client",
    "export_job",
    "manifest_tables",
    "table_rows_on_shards",
]


def export_from_client(
    client: Client,
    dense: dict[str, torch.Tensor],
    spec: ModelSpec,
    steps: int,
    out: Path,
    flag: str = "--export",
    data: DataSpec | None = None,
    tables: Sequence[dict[str, Any]] | None = None,
) -> int:
    """A DLRM's bundle (``spec``: its settings, recorded as the built-in ``dlrm``): every row
    of every table the client's shards hold, and ``dense``, in ``out``; the rows.
    ``tables``: the job's (checkpoint manifest TABLE_FIELDS dicts, job order); None: the
    client's tables (``Client.tables``), named with their dims.  A job exports any model with
    :func:`export_job`; this stays for tools that export shards of the default DLRM."""
    if tables is None:  # the client's tables, with what the spec says of the first
        tables = [{"name": name, "dim": dim} for name, dim in client.tables]
        tables[0].update(seed=spec.seed, init_scale=spec.init_scale)
    return write_bundle(client, tables, spec, dense, steps, out, flag, data)


def _checkpoint(path: Path) -> Manifest:
    """A step directory, or the newest complete checkpoint of a root."""
    if (path / "manifest.json").exists():
        return read_manifest(path)
    m = find_latest(path)
    if m is None:
        raise CheckpointError(f"checkpoint {path}: no complete checkpoint here")
    return m


def _gather_shard_files(m: Manifest, shard_dirs: Sequence[Path], into: Path) -> None:
    """Links every shard file of ``m`` into ``into`` under the name the manifest gives it
    (its ``shard_path``, or its place in the step directory), so that one in-process shard
    with ``into`` as its checkpoint directory loads them all.  Files written by standalone
    shards live under those shards' own ``--checkpoint-dir``: each is looked for in
    ``shard_dirs``, in order."""
    assert m.path is not None
    for e in m.shards:
        if e.shard_path:
            found = [d / e.shard_path for d in shard_dirs if (d / e.shard_path).is_file()]
            if not found:
                where = ", ".join(str(d) for d in shard_dirs) or "no --shard-dir given"
                raise CheckpointError(
                    f"checkpoint {m.path}: shard file {e.shard_path} was written by a "
                    f"standalone shard under its own --checkpoint-dir and is not under any "
                    f"--shard-dir ({where}); give the directory that holds it with --shard-dir"
                )
            source, name = found[0].resolve(), e.shard_path
        else:
            source, name = m.file(e).resolve(), f"{m.path.name}/{e.file}"
        link = into / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(source)


def export_checkpoint(
    path: Path, out: Path, timeout_s: float = 3600.0, shard_dirs: Sequence[Path] = ()
) -> int:
    """A bundle in ``out`` from the checkpoint at ``path`` (a step directory, or a root and
    its newest complete checkpoint).  ``shard_dirs``: where the files that standalone shards
    wrote under their own ``--checkpoint-dir`` are (the manifest names them relative to it)."""
    check_bundle_output(out, "--output")  # before the (long) load
    m = _checkpoint(path)
    assert m.path is not None
    check_files(m)  # every file there with its size, the dense file's checksum
    with tempfile.TemporaryDirectory(prefix="cpu-dist-export-") as tmp:
        _gather_shard_files(m, shard_dirs, Path(tmp))
        return _export_loaded(m, Path(tmp), out, timeout_s)


def manifest_tables(m: Manifest) -> list[dict[str, Any]]:
    """The checkpoint's tables (manifest TABLE_FIELDS dicts, with each table's ``lr`` and
    ``pooling`` from its settings' ``tables.tables`` where recorded); a version 1 or 2
    checkpoint's one table from its settings."""
    if m.tables:
        settings = {t.get("name"): t for t in m.config.get("tables.tables", ()) or ()}
        out = []
        for t in m.tables:
            extra = settings.get(t["name"], {})
            out.append({**{k: extra[k] for k in ("lr", "pooling") if k in extra}, **dict(t)})
        return out
    return [
        {
            "name": m.table,
            "dim": m.dim,
            "seed": int(m.config["train.seed"]),
            "init_scale": float(m.config["model.init_scale"]),
            "features": list(CATEGORICAL_FEATURES),  # the default job's fused table
        }
    ]


def check_model(
    record: ModelRecord, tables: Sequence[Mapping[str, Any]], dense: dict[str, torch.Tensor]
) -> None:
    """Build the model ``record`` names around ``tables`` and load ``dense`` into it, as
    serving will: a checkpoint whose model cannot be rebuilt here (a user model's file moved,
    another version of its code, dense weights of another shape) is refused before the bundle
    is written, with the factory's or torch's message."""
    where = f"model {record.name!r}"
    configs = [table_config(t, where) for t in tables]
    try:
        model = build_model(
            record.name, configs, record.dense_features, record.args, seed=record.seed
        )
        if record.dtype == "float64":
            model.to(torch.float64)
        for _, ebc in collections_of(model):
            ebc.set_row_source(BundleRows({}))  # the rows are not in the dense state
        model.load_state_dict(dense)
    except ModelError as exc:
        raise BundleError(f"the checkpoint's model cannot be rebuilt: {exc}") from None
    except RuntimeError as exc:
        raise BundleError(f"the checkpoint's dense state does not fit its {where}: {exc}") from None


def _export_loaded(m: Manifest, files: Path, out: Path, timeout_s: float) -> int:
    assert m.path is not None
    settings = m.config
    state = torch.load(m.path / DENSE, map_location="cpu", weights_only=True)
    dense = state["model"]
    tables = manifest_tables(m)
    record = settings_model_record(settings, tables)
    check_model(record, tables, dense)
    data = data_spec(settings)
    token = secrets.token_hex(16)
    if m.tables:
        # A shard without tables: the load creates each from the file's spec.
        server = Server(0, token, checkpoint_dir=str(files))
    else:  # version 1 or 2: the one table the files name, declared as its job's shards did
        server = Server(
            m.dim,
            token,
            init_scale=float(tables[0]["init_scale"]),
            seed=int(tables[0]["seed"]),
            table=m.table,
            checkpoint_dir=str(files),
        )
    server.start()
    try:
        client = Client(
            [server.address],
            token,
            tables=[(str(t["name"]), int(t["dim"])) for t in tables],
            timeout_s=timeout_s,
        )
        client.load(
            shard_load_paths(m),
            [e.bytes for e in m.shards],
            [e.crc32 for e in m.shards],
            timeout_s=timeout_s,
        )
        rows = write_bundle(
            client, tables, record, dense, steps_done(m.step), out, "--output", data
        )
        client.close()
    finally:
        server.stop(10.0)
    return rows
