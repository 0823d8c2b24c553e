"""Every row of every table a client's shards hold, streamed page by page into a
:class:`~cpu_dist.serving.bundle.BundleWriter`: the one way rows reach a bundle, whether a job
exports at its end or a checkpoint is loaded into a private shard first."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from cpu_dist.serving.bundle import BundleWriter, DataSpec, ModelSpec, TableInfo
from cpu_dist.serving.model_record import ModelRecord
from cpu_dist.sparse import Client

__all__ = ["PAGE_BYTES", "table_rows_on_shards", "write_bundle"]

PAGE_BYTES = 48 << 20


def table_rows_on_shards(client: Client, name: str) -> int:
    """Rows of table ``name`` over every shard of the client (Stats' per-table figures; a
    shard without them, before tables, holds its one table: Health's rows)."""
    total = 0
    for stats in client.stats():
        per_table = {t["name"]: int(t["rows"]) for t in stats.get("tables", [])}
        total += per_table.get(name, 0) if per_table else int(stats["rows"])
    return total


def write_bundle(
    client: Client,
    tables: Sequence[dict[str, Any]],
    model: ModelRecord | ModelSpec,
    dense: dict[str, torch.Tensor],
    steps: int,
    out: Path,
    flag: str,
    data: DataSpec | None,
) -> int:
    """A bundle in ``out`` of ``model``, ``dense`` and every row of ``tables`` (records, the
    job's order) the client's shards hold; the rows.  ``out`` changes only at the end, from
    nothing or an earlier bundle to the new bundle."""
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
        writer.finish(model, dense, steps, data)
    except BaseException:
        writer.abort()
        raise
    return sum(t.rows for t in infos)
