"""A parameter-server rank: start one shard, publish its address, serve until told to stop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cpu_dist.common.config import Config
from cpu_dist.common.contracts import TABLE
from cpu_dist.common.mpi_context import STOP, Roles, exchange_ps_addresses
from cpu_dist.sparse import Server

WILDCARDS = ("0.0.0.0", "::", "[::]", "")


def _tables(cfg: Config) -> tuple[int, dict[str, Any]]:
    """The shard's tables: ``(dim, keywords)`` for ``Server``.  A job without a job file keeps
    today's one table, declared by its keywords (its optimizer fixed by the first update, as
    ever); a job file's tables are given as specs (``tables=``), and the shard holds those."""
    if not cfg.tables.fused:
        return 0, {"tables": cfg.tables.specs(cfg.train.seed)}
    t = cfg.storage
    rules = {
        k: v
        for k, v in (
            ("admit_after", t.admit_after if t.admit_after > 1 else 0),  # 0 and 1: off
            ("expire_after", t.expire_after),
        )
        if v  # only when set: a shard's defaults are off
    }
    return cfg.model.embedding_dim, {
        "init_scale": cfg.model.init_scale,
        "table": TABLE,
        "seed": cfg.train.seed,
        **rules,
    }


def _tiers(cfg: Config) -> dict[str, Any]:
    """The shard's DRAM budget and SSD tier (only when set: a shard's defaults are off)."""
    t = cfg.storage
    return {
        k: v
        for k, v in (
            ("memory_rows", t.memory_rows),
            ("memory_bytes", t.memory_bytes),
            # each shard makes its own uniquely named database in it (shard-<i>-<pid>-<random>)
            ("ssd_dir", str(Path(t.ssd_dir).resolve()) if t.ssd_dir else ""),
        )
        if v
    }


def run_ps_rank(cfg: Config, roles: Roles, token: str, job_host: str) -> None:
    """``job_host``: the address this node is reached at (see mpi_context.ps_listen_host)."""
    host, port = job_host, 0
    if cfg.job.ps_list:  # as in the first design: PS rank i listens on the i-th --ps_list address
        host, _, p = cfg.job.ps_list[roles.role_rank].rpartition(":")
        port = int(p)
    # Save/Load may touch files under --checkpoint-dir only (absolute), or nowhere.
    ckpt_dir = str(Path(cfg.checkpoint.dir).resolve()) if cfg.checkpoint.dir else ""
    dim, tables = _tables(cfg)
    server, address, error = None, None, None
    try:
        server = Server(
            dim,
            token,
            host=host,
            port=port,
            shard_index=roles.role_rank,
            num_shards=roles.num_ps_ranks,
            max_message_bytes=cfg.client.max_message_bytes,
            checkpoint_dir=ckpt_dir,
            session_idle_timeout_s=cfg.job.session_idle_timeout_s,
            **tables,
            **_tiers(cfg),
        )
        bound = server.start()
        # A wildcard bind (asked for explicitly) is published as this node's own address.
        address = f"{job_host if host in WILDCARDS else host}:{bound}"
    except Exception as exc:  # reported to every rank by the allgather below
        error = f"{type(exc).__name__}: {exc} (listening on {host}:{port})"
    exchange_ps_addresses(roles, address, error, cfg.job.barrier_timeout_s)
    assert server is not None  # exchange_ps_addresses raised otherwise
    # Serve until worker 0 sends Shutdown once every worker is done; the server drains
    # in-flight calls first.  The wait sleeps in C++ with the GIL released: no spinning core.
    # A stop request this rank got (SIGTERM, SIGUSR1) goes to worker 0, which stops the job.
    while not server.wait(1.0):
        STOP.relay(roles.world)
