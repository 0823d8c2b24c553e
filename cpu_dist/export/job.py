"""``export_job``: a job's bundle at its end (``launcher.py --export DIR``), for any model."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from cpu_dist.common.config import Config
from cpu_dist.export.client_rows import write_bundle
from cpu_dist.export.records import data_spec, job_model_record, job_table_records
from cpu_dist.sparse import Client

__all__ = ["export_job"]


def export_job(
    cfg: Config,
    model: nn.Module,
    client: Client,
    steps: int,
    out: Path,
    *,
    dense_features: int,
    name: str,
    args: Mapping[str, Any],
    flag: str = "--export",
) -> int:
    """Write the bundle of a job's model: its record (``name`` and ``args`` as the job built
    it: ``job_model.model_name(cfg)``, ``job_model.model_args(cfg)``; ``dense_features``: the
    data's), its tables as its collections hold them (job order), its dense state (the model's
    ``state_dict()``: a distributed collection saves no rows), a user model's source, and every
    row the client's shards hold.  Returns the rows written.

    Args:
        cfg: the job's Config (dtype, seed, tables, data settings, batch size).
        model: the model the job trained (its collections distributed).
        client: a client of the job's shards, every commit applied.
        steps: the steps the model has trained (``checkpoint.steps_done``).
        out: the bundle's directory (missing, empty or an earlier bundle).

    Example::

        export_job(cfg, model, client, steps, Path(cfg.output.export),
                   dense_features=dataset.num_dense, name=model_name(cfg), args=model_args(cfg))
    """
    record = job_model_record(cfg, name=name, args=args, dense_features=dense_features)
    tables = job_table_records(cfg, model)
    dense = {k: v.detach().clone() for k, v in model.state_dict().items()}
    data = data_spec(cfg.settings())
    return write_bundle(client, tables, record, dense, steps, out, flag, data)
