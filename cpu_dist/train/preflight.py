"""Checks of a job's surroundings before anything is trained or written, with a verdict every
rank shares (exit code 2, one message): a checkpoint directory that another run holds
(``OWNER.json``, taken here by world rank 0, which is worker 0) or holds checkpoints of, and
external shards (``--ps_list`` without PS ranks) that do not match the job or already
hold another job's rows.  A job whose job file declares tables creates them on the external
shards (``Client.create_tables``: idempotent for an identical spec, refused naming the table
and the field for another).  The flags themselves were checked by ``cpu_dist.common.flags``."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from cpu_dist.checkpoint.coordinator import checkpoint_to_resume
from cpu_dist.checkpoint.manifest import CheckpointError, Manifest, find_latest
from cpu_dist.checkpoint.owner import Owner, OwnerError, claim
from cpu_dist.common.config import Config
from cpu_dist.common.contracts import TABLE
from cpu_dist.common.files import OutputError
from cpu_dist.common.mpi_context import JobError, Roles
from cpu_dist.sparse import Client, PSError
from cpu_dist.train.metrics import check_resume_log

if TYPE_CHECKING:
    from cpu_dist.sparse._ps import TableSpec


class SetupError(JobError):
    """The job cannot start as configured; the message says why and what to do.  Raised on
    every rank (the verdict is broadcast), so every rank exits 2 with one message."""


def _checkpoint_to_resume(cfg: Config) -> bool:
    return cfg.checkpoint.dir is not None and find_latest(Path(cfg.checkpoint.dir)) is not None


def _newest(cfg: Config) -> Manifest | None:
    assert cfg.checkpoint.dir is not None
    try:
        return find_latest(Path(cfg.checkpoint.dir))
    except CheckpointError as exc:
        raise SetupError(str(exc)) from None


def check_checkpoint_dir(cfg: Config) -> Owner | None:
    """Takes the checkpoint directory for this run (``owner.claim``: refused while another
    run holds it), then, holding it: a fresh run must not share it with another run's
    checkpoints (it would prune them, or a later --resume would continue the wrong run); a
    resume's checkpoint must be whole and match the job (``checkpoint_to_resume``).  Returns
    the hold (worker 0 renews and releases it); the run id it names is the run's: a fresh
    one, or the checkpoint's for a resume (a resume of the same run takes the record over)."""
    ck = cfg.checkpoint
    if ck.dir is None:
        return None
    newest = _newest(cfg) if ck.resume else None
    run_id = newest.run_id if newest is not None and newest.run_id else secrets.token_hex(8)
    try:
        owner = claim(Path(ck.dir).resolve(), run_id, resume=ck.resume, flag_dir=ck.dir)
    except OwnerError as exc:
        raise SetupError(str(exc)) from None
    try:
        _check_held_dir(cfg)
    except BaseException:
        owner.release()
        raise
    return owner


def _check_held_dir(cfg: Config) -> None:
    ck = cfg.checkpoint
    assert ck.dir is not None
    if ck.resume:
        try:
            checkpoint_to_resume(cfg)
        except CheckpointError as exc:
            raise SetupError(str(exc)) from None
        return
    latest = _newest(cfg)
    if latest is not None:
        raise SetupError(
            f"--checkpoint-dir {ck.dir} already holds checkpoints of another run (newest: "
            f"{latest.path.name if latest.path else '?'}, run {latest.run_id or '?'}); pass "
            "--resume to continue that "
            "run, or choose an empty directory"
        )


def _mismatches(cfg: Config, index: int, count: int, health: dict) -> list[str]:
    """What a shard's Health says that the job does not expect: its place in --ps_list, and
    for the flags' one table (a job without a job file) that table's settings; a job file's
    tables are created by the job instead (:func:`create_job_tables`), which compares them."""
    placement = {"shard_index": index, "num_shards": count}
    if not cfg.tables.fused:
        return _differences(placement, health)
    expect = {
        **placement,
        "dim": cfg.model.embedding_dim,
        "table": TABLE,
        "seed": cfg.train.seed,
        # the shard keeps its init scale in float32
        "init_scale": float(np.float32(cfg.model.init_scale)),
        # the table's step rules change the model: a shard must apply the job's own
        "admit_after": cfg.storage.admit_after if cfg.storage.admit_after > 1 else 0,
        "expire_after": cfg.storage.expire_after,
    }
    if health.get("admit_after") == 1:  # 0 and 1 both mean "off"
        health = {**health, "admit_after": 0}
    return _differences(expect, health)


def _differences(expect: dict, health: dict) -> list[str]:
    return [
        f"{key} {health.get(key)!r} (the job expects {want!r})"
        for key, want in expect.items()
        if health.get(key) != want
    ]


def _rows(health: dict) -> int:
    rows = health.get("rows", 0)
    return int(rows) if isinstance(rows, int) else 0


def check_external_shards(cfg: Config, token: str) -> None:
    """Every shard of ``--ps_list`` is the shard its position says, with the job's dim, seed,
    init scale and table, and holds no rows unless the job restores over them or reuses them."""
    addresses = list(cfg.job.ps_list)
    client = Client(addresses, token, cfg.model.embedding_dim, timeout_s=cfg.client.rpc_timeout_s)
    try:
        health = client.health()
    except PSError as exc:
        hint = ""
        if getattr(exc, "code", None) == "UNAUTHENTICATED" or "UNAUTHENTICATED" in str(exc):
            hint = " (--token-file or $CPU_DIST_TOKEN must hold the shards' own token)"
        raise SetupError(f"--ps_list: {exc}{hint}") from None
    finally:
        client.close()
    for i, (address, h) in enumerate(zip(addresses, health)):
        wrong = _mismatches(cfg, i, len(addresses), h)
        if wrong:
            how = (
                "the job's --seed, --init-scale, --embedding-dim, --ps-admit-after and "
                "--ps-expire-after, and "
                if cfg.tables.fused
                else ""
            )
            raise SetupError(
                f"shard {i} of --ps_list ({address}) does not match the job: "
                + "; ".join(wrong)
                + f" (start it with {how}--shard-index {i} --num-shards {len(addresses)})"
            )
    held = [(a, _rows(h)) for a, h in zip(addresses, health) if _rows(h)]
    restoring = cfg.checkpoint.resume and _checkpoint_to_resume(cfg)
    if held and not restoring and not cfg.job.reuse_shard_rows:
        where = ", ".join(f"{a} holds {n} rows" for a, n in held)
        raise SetupError(
            f"the shards already hold rows ({where}): another job's table? Restart them, "
            "pass --resume with a checkpoint to restore over them, or --reuse-shard-rows to "
            "train on them"
        )


def create_job_tables(cfg: Config, token: str) -> None:
    """A job file's tables on every external shard (``CreateTables``): created where missing,
    kept where a shard already holds the identical spec (a restarted job, or a table another
    job shares), and refused, naming the shard, the table and the field, where a shard holds a
    table of that name with another spec (among them the table a shard's own ``--dim``,
    ``--table``, ``--seed``, ``--init-scale`` and rule flags declare).  Nothing to do for the
    flags' one table: :func:`check_external_shards` compared it with the shard's."""
    if cfg.tables.fused:
        return
    specs = cfg.tables.specs(cfg.train.seed)
    for i, address in enumerate(cfg.job.ps_list):
        client = Client(
            [address], token, cfg.model.embedding_dim, timeout_s=cfg.client.rpc_timeout_s
        )
        try:
            client.create_tables(cast("list[TableSpec]", specs))
        except (PSError, ValueError) as exc:
            raise SetupError(
                f"shard {i} of --ps_list ({address}) refused the tables of --config "
                f"{cfg.tables.source}: {exc} (restart the shard, or give the table another "
                "name)"
            ) from None
        finally:
            client.close()


def check_external_checkpoint_dirs(cfg: Config, token: str) -> None:
    """A job that checkpoints has standalone shards write their part themselves, so each must
    have been started with a checkpoint directory of its own.  Asked with a Load of a path no
    shard accepts ("."): a shard without a directory says so (FAILED_PRECONDITION) before it
    looks at the path, one with a directory refuses the path; nothing is read or changed."""
    if cfg.checkpoint.dir is None:
        return
    for i, address in enumerate(cfg.job.ps_list):
        client = Client(
            [address], token, cfg.model.embedding_dim, timeout_s=cfg.client.rpc_timeout_s
        )
        try:
            client.load(["."])
        except PSError as exc:
            if getattr(exc, "code", None) == "FAILED_PRECONDITION" or (
                "no checkpoint directory" in str(exc)
            ):
                raise SetupError(
                    f"shard {i} of --ps_list ({address}) has no checkpoint directory, and this "
                    f"job writes checkpoints (--checkpoint-dir {cfg.checkpoint.dir}): start the "
                    "shard with `python -m cpu_dist.sparse.server ... --checkpoint-dir DIR` (it "
                    "writes its files under DIR/<run id>/step-N/)"
                ) from None
        finally:
            client.close()


def preflight(cfg: Config, roles: Roles, token: str) -> Owner | None:
    """Raises SetupError on every rank when world rank 0 finds the job cannot start.  Returns
    world rank 0's hold on the checkpoint directory (None elsewhere, and without one); the
    caller releases it at every exit."""
    verdict, owner = None, None
    if roles.rank == 0:
        try:
            owner = check_checkpoint_dir(cfg)
            check_resume_log(cfg)  # --resume continues its own run's --metrics-out only
            if cfg.job.external_shards:
                check_external_shards(cfg, token)
                check_external_checkpoint_dirs(cfg, token)
                create_job_tables(cfg, token)  # last: nothing is created for a job refused
        except BaseException as exc:
            if owner is not None:  # refused (or failed) after all: the directory is free
                owner.release()
                owner = None
            if not isinstance(exc, (SetupError, OutputError)):
                raise
            verdict = str(exc)
    verdict = roles.world.bcast(verdict, root=0)
    if verdict is not None:
        raise SetupError(verdict)
    return owner
