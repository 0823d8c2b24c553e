"""Export a trained model as a serving bundle (:mod:`cpu_dist.serving.bundle`).

Two ways in, one way out: at the end of training (``launcher.py --export DIR``: the job's own
shards are dumped page by page) or from a checkpoint (``python -m cpu_dist.export
CHECKPOINT_DIR --output DIR``: the checkpoint is loaded into a private in-process shard, with
every check a resume makes, and dumped the same way).  Either way the rows stream through a
memory map: no message-size limit, and memory of 16 bytes per row besides one page.
"""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Sequence
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
from cpu_dist.common.config import DataConfig
from cpu_dist.serving.bundle import (
    BundleWriter,
    DataSpec,
    ModelSpec,
    TableInfo,
    check_bundle_output,
    spec_from_dense_state,
)
from cpu_dist.sparse import Client, Server

PAGE_BYTES = 48 << 20


def table_rows_on_shards(client: Client, name: str) -> int:
    """Rows of table ``name`` over every shard of the client (Stats' per-table figures; a
    shard without them, before tables, holds its one table: Health's rows)."""
    total = 0
    for stats in client.stats():
        per_table = {t["name"]: int(t["rows"]) for t in stats.get("tables", [])}
        total += per_table.get(name, 0) if per_table else int(stats["rows"])
    return total


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
    """Every row of every table the client's shards hold, and ``dense``, as a bundle in
    ``out`` (a folder per table); the rows.  ``tables``: the job's (checkpoint manifest
    TABLE_FIELDS dicts, job order, recorded in the bundle's manifest); None: the client's
    tables (``Client.tables``), named with their dims.  ``out``
    changes only at the end, from nothing or an earlier bundle to the new bundle."""
    if tables is None:  # the client's tables, with what the spec says of the first
        tables = [{"name": name, "dim": dim} for name, dim in client.tables]
        tables[0].update(seed=spec.seed, init_scale=spec.init_scale)
    infos = [
        TableInfo(
            str(t["name"]), int(t["dim"]), table_rows_on_shards(client, str(t["name"])), dict(t)
        )
        for t in tables
    ]
    writer = BundleWriter(out, infos, flag)
    try:
        for t in infos:
            for keys, values, _state in client.dump_pages(table=t.name, max_bytes=PAGE_BYTES):
                writer.add(t.name, keys, values)
        writer.finish(spec, dense, steps, data)
    except BaseException:
        writer.abort()
        raise
    return sum(t.rows for t in infos)


def data_spec(settings: dict[str, Any]) -> DataSpec:
    """The data settings of a job's ``Config.settings()`` (a checkpoint records them all)."""
    sizes = settings.get("data.num_embeddings_per_feature")
    return DataSpec(
        kind=str(settings["data.kind"]),
        max_ind_range=settings.get("data.max_ind_range"),
        num_embeddings_per_feature=None if sizes is None else tuple(int(n) for n in sizes),
        zipf_exponent=float(settings.get("data.zipf_exponent", DataConfig.zipf_exponent)),
        batch_size=int(settings["train.batch_size"]),
    )


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
    """The checkpoint's tables (manifest TABLE_FIELDS dicts); a version 1 or 2 checkpoint's
    one table from its settings."""
    if m.tables:
        return [dict(t) for t in m.tables]
    return [
        {
            "name": m.table,
            "dim": m.dim,
            "seed": int(m.config["train.seed"]),
            "init_scale": float(m.config["model.init_scale"]),
        }
    ]


def _export_loaded(m: Manifest, files: Path, out: Path, timeout_s: float) -> int:
    assert m.path is not None
    settings = m.config
    state = torch.load(m.path / DENSE, map_location="cpu", weights_only=True)
    dense = state["model"]
    tables = manifest_tables(m)
    spec = spec_from_dense_state(
        dense,
        dim=int(settings.get("model.embedding_dim", m.dim)),
        bot_mlp=tuple(settings["model.bot_mlp"]),
        top_mlp=tuple(settings["model.top_mlp"]),
        dtype=settings["model.dtype"],
        seed=int(settings["train.seed"]),
        init_scale=float(settings["model.init_scale"]),
        table=m.table,
    )
    data = data_spec(settings)
    token = secrets.token_hex(16)
    if m.tables:
        # A shard without tables: the load creates each from the file's spec.
        server = Server(0, token, checkpoint_dir=str(files))
    else:  # version 1 or 2: the one table the files name, declared as its job's shards did
        server = Server(
            m.dim,
            token,
            init_scale=spec.init_scale,
            seed=spec.seed,
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
        rows = export_from_client(
            client, dense, spec, steps_done(m.step), out, "--output", data, tables
        )
        client.close()
    finally:
        server.stop(10.0)
    return rows
