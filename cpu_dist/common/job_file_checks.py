"""A job file (``--config``) against the flags: the checks ``validate`` runs where the
file's tables meet the flags, and the warnings for table-default flags every table overrides.

Refusals are :class:`~cpu_dist.common.job_file.JobFileError`s (``validate`` reports them as
ConfigErrors, with the same message), naming the flag, the file and, where one is at fault,
the table.
"""

from __future__ import annotations

import argparse

from cpu_dist.common.config import TrainConfig
from cpu_dist.common.job_file import JobFileError, TableDefaults, job_tables, read_job_file
from cpu_dist.common.tables import CATEGORICAL_FEATURES, JobTables


def job_file_tables(a: argparse.Namespace, train: TrainConfig) -> JobTables | None:
    """The tables of the ``--config`` job file (None: no job file, or one without
    ``[[tables]]``: the flags declare the one table).  A table that omits a key takes the
    flags' value (``--embedding-dim``, ``--sparse-optimizer``, ``--sparse-lr``,
    ``--init-scale``, ``--ps-admit-after``, ``--ps-expire-after``)."""
    path = getattr(a, "config", None)
    if not path:
        return None
    for flag, value in (
        ("--num-embeddings-per-feature", a.num_embeddings_per_feature),
        ("--max-ind-range", a.max_ind_range),
    ):
        if value is not None:
            raise JobFileError(
                f"{flag}: refused beside a job file (--config {path}): give each table its "
                "num_embeddings"
            )
    for flag, value in (
        ("--ps-admit-after", a.ps_admit_after),
        ("--ps-expire-after", a.ps_expire_after),
    ):
        if value < 0:
            raise JobFileError(f"{flag} {value}: must be >= 0")
    job_file = getattr(a, "job_file", None) or read_job_file(path)
    return job_tables(
        job_file,
        TableDefaults(
            dim=a.embedding_dim,
            optimizer=a.sparse_optimizer,
            lr=train.sparse_lr,
            init_scale=a.init_scale,
            admit_after=a.ps_admit_after,
            expire_after=a.ps_expire_after,
        ),
        CATEGORICAL_FEATURES,  # every data kind's: Criteo's and the synthetic stream's
        a.data,
    )


def check_rows_budget(a: argparse.Namespace, tables: JobTables | None) -> None:
    """A budget in rows counts rows of one width: refused for several tables."""
    if tables is not None and len(tables.tables) > 1 and a.ps_memory_rows:
        raise JobFileError(
            f"--ps-memory-rows with {len(tables.tables)} tables (--config {tables.source}): "
            "rows of different widths cost different memory; give the budget in bytes, "
            "--ps-memory-bytes N"
        )


def check_cache_tables(tables: JobTables | None) -> None:
    """The cache stage (``--read-mode bagpipe``) serves the flags' one fused table only."""
    if tables is not None:
        many = f"{len(tables.tables)} tables" if len(tables.tables) > 1 else "a table"
        raise JobFileError(
            f"--read-mode bagpipe with {many} of a job file (--config {tables.source}): the "
            "cache stage serves the flags' one fused table only for now (a later version "
            "makes it per table); drop --read-mode bagpipe or the job file's [[tables]]"
        )


# The flags that are the defaults of a job file's tables, and the table key each stands for.
TABLE_DEFAULT_FLAGS = (
    ("embedding_dim", "dim"),
    ("sparse_optimizer", "optimizer"),
    ("sparse_lr", "lr"),
    ("init_scale", "init_scale"),
    ("ps_admit_after", "admit_after"),
    ("ps_expire_after", "expire_after"),
)


def table_defaults_unused(a: argparse.Namespace, given: frozenset[str]) -> list[str]:
    """A table-default flag given where every table of the job file sets that key itself (a
    table's own keys are never overridden).  ``--embedding-dim`` still sets the model's width
    when the tables' widths differ, so it is named only when they are one."""
    job_file = getattr(a, "job_file", None)
    if job_file is None or not job_file.tables:
        return []
    entries = job_file.tables
    out = []
    for dest, key in TABLE_DEFAULT_FLAGS:
        if dest not in given or not all(key in t for t in entries):
            continue
        if key == "dim" and len({repr(t["dim"]) for t in entries}) > 1:
            continue
        flag = "--" + dest.replace("_", "-")
        out.append(f"{flag} has no effect: every table of --config {job_file.path} sets {key}")
    return out
