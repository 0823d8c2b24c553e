"""Taking and restoring checkpoints inside a training job (called by every worker).

Save at step t (after step t's gradients were submitted): every worker waits until step t is
committed on every shard; worker 0 asks each shard to write its rows (the shard checks that
its commit session is exactly at step t, so the files hold steps 0..t and nothing of t+1),
writes the dense state, then the manifest; the other workers wait at a barrier meanwhile, so
no update of step t+1 can reach a shard before its file is written.

The step directory is written under a temporary name (``temp_dir_name``: the shards write
their files into it, worker 0 the dense state, then the manifest) and renamed to ``step-N``
only when complete and only if no ``step-N`` is there (``publish``), so two runs never share
one.  Worker 0 holds the directory (``owner.py``: ``OWNER.json``) and re-reads the record
before each save and prune: a run that no longer holds it stops (exit 2).

Restore: worker 0 picks the newest complete checkpoint, checks it (manifest, configuration,
every file's presence and size, the dense file's checksum) before anything is loaded, then
has every shard load the rows it owns from all shard files (re-partitioning when the shard
count changed); every worker then loads the dense state.  Training resumes at step t+1.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import sys
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from mpi4py import MPI

from cpu_dist.common.config import Config, DataConfig
from cpu_dist.common.contracts import TABLE
from cpu_dist.common.mpi_context import EXIT_STOPPED, STOP, wait_all
from cpu_dist.common.setting_flags import setting_flag
from cpu_dist.sparse import Client

from .manifest import (
    DENSE,
    OUTPUTS,
    FileEntry,
    Manifest,
    check_files,
    check_matches,
    find_latest,
    prune,
    publish,
    shard_file_name,
    shard_load_paths,
    step_dir_name,
    steps_done,
    temp_dir_name,
)
from .owner import Owner

if TYPE_CHECKING:  # a PS rank's preflight reads manifests here and must not import torch
    import torch

T = TypeVar("T")

# A test hook: worker 0 sends itself SIGTERM as the named evaluation starts ("eval",
# "final_eval", "test"), so that a test stops a job at that point deterministically.
TEST_STOP_AT_ENV = "CPU_DIST_TEST_STOP_AT"


class StopRequested(Exception):
    """Raised on every worker together out of an evaluation that an agreed stop request
    interrupts (``Checkpointer.interruptible``); the caller checkpoints and stops."""


# Settings a resumed job must share with the checkpoint: they decide what the saved state means.
# The learning rates are not among them: the sparse one travels with every commit, the dense
# one is set into the restored optimizer state; a resumed run says which settings it changed.
MUST_MATCH = (
    "model.name",  # the model and its arguments: another model's weights mean nothing here
    "model.args",
    "model.dcn_num_layers",
    "model.dcn_low_rank_dim",
    "model.embedding_dim",
    "model.bot_mlp",
    "model.top_mlp",
    "model.dtype",
    "model.init_scale",
    "train.dense_optimizer",
    "train.sparse_optimizer",
    "train.aggregation",
    "train.batch_size",
    "train.seed",
    "data.kind",
    "data.zipf_exponent",
    "data.skip_bad_lines",
    "data.num_embeddings_per_feature",
    "data.max_ind_range",
    "data.shuffle",
    "data.bags",
    "data.weights",
    "data.multi_hot_sizes",
    "data.multi_hot_distribution",
    "data.features",
    "data.weight_columns",
    "data.label",
    "data.dense",
    "data.num_dense",  # the synthetic stream's dense width and its features' cardinalities
    "data.cardinalities",
    "table.admit_after",
    "table.expire_after",
)
# MUST_MATCH settings that checkpoints written before them lack: such a checkpoint was
# trained with their default (13 dense features, no cardinalities of other features).
MUST_MATCH_DEFAULTS = {"data.num_dense": DataConfig.num_dense, "data.cardinalities": []}


def checkpoint_to_resume(cfg: Config) -> Manifest | None:
    """The newest complete checkpoint under ``--checkpoint-dir``, checked against this job
    before anything is loaded (format, table, dim, the must-match settings, every file's
    presence and size, the dense file's checksum); None when there is none.  Raises
    CheckpointError naming the file.  The preflight calls it, so a bad checkpoint stops the
    job before anything starts, and the restore calls it again for what it loads."""
    if cfg.checkpoint.dir is None:
        return None
    m = find_latest(Path(cfg.checkpoint.dir).resolve())
    if m is None:
        return None
    m.config = {**MUST_MATCH_DEFAULTS, **m.config}
    check_matches(
        m,
        dim=cfg.model.embedding_dim,
        table=TABLE,
        config=cfg.settings(),
        must_match=MUST_MATCH,
        tables=job_tables(cfg),
    )
    check_files(m)
    return m


def job_tables(cfg: Config) -> list[dict[str, Any]]:
    """What a manifest records of the job's tables (manifest.TABLE_FIELDS), in the job's
    order: each table's shard spec and the features it serves."""
    return [{**t.spec(cfg.train.seed), "features": list(t.features)} for t in cfg.tables.tables]


def job_outputs(cfg: Config) -> list[str]:
    """What this job produces once training is complete (manifest.OUTPUTS keys, in order)."""
    out = cfg.output
    wanted = {
        "final_eval": True,
        "test": out.test_batches != 0,
        "dump_state": bool(out.dump_state),
        "export": bool(out.export),
    }
    return [o for o in OUTPUTS if wanted[o]]


def describe_owed(owed: list[str]) -> str:
    return ", ".join(OUTPUTS[o] for o in owed)


def changed_settings(saved: dict, now: dict) -> list[str]:
    """``--flag OLD -> NEW`` for every setting a resumed run changed (none of MUST_MATCH:
    the check refused those): the learning rates, the step count, logging, ..."""
    return [
        f"{setting_flag(k)} {saved[k]!r} -> {now.get(k)!r}"
        for k in sorted(saved)
        if k in now and saved[k] != now[k]
    ]


# The sha256 of a user model's source (``models.factory.source_sha256``), recorded in a
# manifest's settings beside Config.settings(): the exporter refuses a checkpoint whose model
# code changed since (cpu_dist/export/records.py), and a resume reports the change.
SOURCE_SHA256_KEY = "model.source_sha256"


class Commits(Protocol):
    """What a checkpoint needs from the commit protocol (cpu_dist.sparse.commits)."""

    def wait_readable(self, step: int) -> None: ...

    @property
    def session(self) -> SessionInfo: ...


class SessionInfo(Protocol):
    @property
    def id(self) -> int: ...

    def session_step(self, step: int) -> int: ...


class DenseOptimizer(Protocol):
    """What a checkpoint needs of the dense update (cpu_dist.dense.sync.DenseSync)."""

    def optimizer_state(self) -> dict[str, Any]: ...

    def load_optimizer_state(self, state: dict[str, Any]) -> None: ...


class Checkpointer:
    def __init__(
        self,
        cfg: Config,
        comm: MPI.Intracomm,
        client: Client,
        model: torch.nn.Module,
        dense: DenseOptimizer,
        commits: Commits,
        model_source_sha256: str | None = None,
        owner: Owner | None = None,
    ) -> None:
        ck = cfg.checkpoint
        self.cfg, self.comm, self.client = cfg, comm, client
        self.model, self.dense, self.commits = model, dense, commits
        # what a manifest records: the settings and the user model's source hash, if any
        self.settings = {**cfg.settings(), SOURCE_SHA256_KEY: model_source_sha256}
        self.root = Path(ck.dir).resolve() if ck.dir else None
        self.chief = comm.Get_rank() == 0
        self.every, self.keep, self.resume = ck.every, ck.keep, ck.resume
        self.timeout_s = ck.timeout_s
        self.external = cfg.job.external_shards  # standalone shards: files under their own dirs
        # The other workers wait while the chief has every shard write: the checkpoint's whole
        # budget on top of the usual wait for each other.
        self.wait_s = cfg.job.barrier_timeout_s + ck.timeout_s
        self.saved: list[int] = []  # steps of this run's checkpoints (and the one restored)
        self.owner = owner if self.chief else None  # worker 0's hold on the directory
        # This run's id: the one its owner record names (a fresh run's own, a resumed run's
        # checkpoint's; the preflight chose it), else made here by worker 0.
        mine = owner.run_id if owner is not None else secrets.token_hex(8)
        self.run_id: str = comm.bcast(mine if self.chief else None, root=0)
        self.outputs = job_outputs(cfg)  # what this run owes once training is complete
        self.owed: list[str] = []  # a restored checkpoint's (of this run's outputs)
        self.last: Manifest | None = None  # worker 0: the newest written or restored

    # -- save ---------------------------------------------------------------------------
    def after_step(self, step: int) -> None:
        if self.owner is not None:
            self.owner.renew_if_due()
        if self.root is not None and self.every > 0 and (step + 1) % self.every == 0:
            self.save(step)

    def stop_agreed(self) -> bool:
        """Collective: whether any worker (or a PS rank) was asked to stop.  Without
        --checkpoint-dir the stop signals keep their default action (the job dies), so
        there is nothing to agree on."""
        return self.root is not None and STOP.agreed(self.comm)

    def stop_requested(self, step: int) -> bool:
        """At the boundary after ``step`` (every worker calls it): True when any worker was
        asked to stop (``STOP``), after the state of steps 0..step is saved (unless
        ``after_step`` just saved it); after the last step that checkpoint owes every
        output."""
        if not self.stop_agreed():
            return False
        self.stop_owing(step)
        return True

    def stop_owing(self, step: int, owed: list[str] | None = None) -> None:
        """Every worker, on an agreed stop: the state of steps 0..step is in a checkpoint that
        records ``owed`` (None: what a checkpoint after ``step`` owes), and worker 0 says so."""
        owed = self._owed_at(step) if owed is None else owed
        if self.saved and self.saved[-1] == step:
            if self.chief:
                self._record_owed(owed)
        else:
            self.save(step, owed)
        if self.chief:
            assert self.root is not None
            more = f" (owing {describe_owed(owed)}, which --resume makes)" if owed else ""
            print(
                f"cpu_dist: stopped on request after {steps_done(step)} steps; checkpoint "
                f"{self.root / step_dir_name(steps_done(step))} written{more}; exit code "
                f"{EXIT_STOPPED}, --resume continues",
                file=sys.stderr,
                flush=True,
            )

    def outputs_done(self, step: int) -> bool:
        """Every worker, once the outputs are made: the checkpoint after ``step`` (the last),
        if there is one, owes nothing any more.  True when a stop was asked meanwhile: the
        job then ends as stopped (exit 75) with that checkpoint written."""
        if self.stop_agreed():
            self.stop_owing(step, [])
            return True
        if self.chief and self.saved and self.saved[-1] == step:
            self._record_owed([])
        return False

    def interruptible(self, batches: Iterable[T], point: str) -> Iterator[T]:
        """``batches`` of an evaluation, asking before each whether a stop was agreed (every
        worker walks the same global batches, so all ask at the same one) and renewing
        worker 0's hold on the directory; raises StopRequested on every worker together."""
        for batch in batches:
            if self.root is not None:
                if self.chief and os.environ.get(TEST_STOP_AT_ENV) == point and not STOP.requested:
                    signal.raise_signal(signal.SIGTERM)
                if self.owner is not None:
                    self.owner.renew_if_due()
                if STOP.agreed(self.comm):
                    raise StopRequested(point)
            yield batch

    def kept_alive(self, what: str) -> AbstractContextManager[None]:
        """The owner record's heartbeat renewed while ``what`` runs (``Owner.kept_alive``);
        nothing where no directory is held (no --checkpoint-dir, or not worker 0)."""
        return self.owner.kept_alive(what) if self.owner is not None else nullcontext()

    def _owed_at(self, step: int) -> list[str]:
        return list(self.outputs) if steps_done(step) >= self.cfg.train.max_step else []

    def _record_owed(self, owed: list[str]) -> None:
        """Worker 0: the newest checkpoint (written or restored by this run) records ``owed``."""
        m = self.last
        if m is None or m.path is None or m.owed == owed:
            return
        if self.owner is not None:
            self.owner.check(f"the manifest of {m.path}")
        m.owed = list(owed)
        m.write(m.path)

    def save(self, step: int, owed: list[str] | None = None) -> None:
        self.commits.wait_readable(step + 1)  # step is applied on every shard
        optimizer_state = self.dense.optimizer_state()  # collective (a sharded optimizer)
        if self.chief:
            self._write(step, optimizer_state, self._owed_at(step) if owed is None else owed)
        wait_all(self.comm, self.wait_s, f"checkpoint of step {step}")
        self.saved.append(step)

    def _write(self, step: int, optimizer_state: dict[str, Any], owed: list[str]) -> Manifest:
        """Worker 0: the step directory, written under a temporary name and published."""
        assert self.root is not None
        name = step_dir_name(steps_done(step))
        if self.owner is not None:
            self.owner.check(f"checkpoint {name}")
        self.root.mkdir(parents=True, exist_ok=True)
        work = self.root / temp_dir_name(name, self.run_id)
        work.mkdir()
        try:
            with self.kept_alive(f"checkpoint {name}"):
                m = self._fill(work, step, optimizer_state, owed)
            publish(work, self.root / name)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        m.path = self.root / name
        self.last = m
        if self.owner is not None:
            self.owner.renew("pruning")  # re-read: prune only while the directory is ours
        prune(self.root, self.keep, self.run_id)  # keep 0: every checkpoint; temp folders go
        return m

    def _fill(
        self, work: Path, step: int, optimizer_state: dict[str, Any], owed: list[str]
    ) -> Manifest:
        """Every file of a checkpoint into ``work``: the shards', the dense state, then the
        manifest."""
        assert self.root is not None
        name = step_dir_name(steps_done(step))
        n = self.client.num_shards
        files = [shard_file_name(i, n) for i in range(n)]
        # PS ranks of the job write into the step directory being written (their directory is
        # the job's); standalone shards under their own directory, in a folder of this run, so
        # that jobs sharing a shard never share files.
        prefix = f"{self.run_id}/{name}" if self.external else work.name
        paths = [f"{prefix}/{f}" for f in files]
        session = self.commits.session
        results = self.client.save(
            paths, step, session.id, session.session_step(step), timeout_s=self.timeout_s
        )
        shards = [
            FileEntry(
                file=Path(p).name,
                bytes=int(r["bytes"]),
                crc32=int(r["checksum"]),
                rows=int(r["rows"]),
                shard_path=p if self.external else "",
            )
            for p, r in zip(paths, results)
        ]
        from . import dense_state  # torch: only where a dense state is written

        dense = dense_state.save_dense(work / DENSE, self.model, optimizer_state, step)
        tables = job_tables(self.cfg)
        m = Manifest(
            step=step,
            table=tables[0]["name"],
            dim=int(tables[0]["dim"]),
            num_shards=n,
            shards=shards,
            dense=dense,
            config=self.settings,
            run_id=self.run_id,
            tables=tables,
            owed=list(owed),
        )
        m.write(work)
        return m

    # -- restore ------------------------------------------------------------------------
    def restore(self) -> int:
        """Returns the step to start at (0 when there is nothing to resume from)."""
        if not self.resume:
            return 0
        assert self.root is not None
        info = None
        if self.chief:
            m = checkpoint_to_resume(self.cfg)
            if m is None:
                print(
                    f"cpu_dist: --resume: no complete checkpoint in {self.root}; starting at "
                    "step 0",
                    file=sys.stderr,
                    flush=True,
                )
            else:
                assert m.path is not None
                changed = changed_settings(m.config, self.settings)
                if changed:
                    print(
                        "cpu_dist: --resume: changed since the checkpoint: " + "; ".join(changed),
                        file=sys.stderr,
                        flush=True,
                    )
                # Take the shards over: sessions a crashed job left open are aborted (their
                # unfinished steps dropped), then the rows are replaced by the checkpoint's.
                self.client.abort_sessions()
                self.client.load(
                    shard_load_paths(m),
                    [e.bytes for e in m.shards],
                    [e.crc32 for e in m.shards],
                    timeout_s=self.timeout_s,
                )
                info = (str(m.path), m.step, m.run_id or self.run_id, m.owed)
                self.last = m
        info = self.comm.bcast(info, root=0)
        if info is None:
            return 0
        path, step, self.run_id, owed = info
        self.saved.append(step)  # a stop right away records what it owes in this one
        self.owed = [o for o in owed if o in self.outputs]
        from . import dense_state  # torch: only where a dense state is read

        optimizer_state = dense_state.load_dense(Path(path) / DENSE, self.model, step)
        for group in optimizer_state.get("param_groups", []):
            group["lr"] = self.cfg.train.lr  # this run's, which may differ from the saved one
            # and this run's weight decay, betas, momentum, eps (changed_settings names them)
            group.update(dict(self.cfg.train.dense_optimizer_args))
        self.dense.load_optimizer_state(optimizer_state)
        if self.chief:
            print(
                f"cpu_dist: resumed from {path} ({steps_done(step)} steps done); continuing "
                f"at step {steps_done(step)}",
                file=sys.stderr,
                flush=True,
            )
        return steps_done(step)  # the index of the next step
