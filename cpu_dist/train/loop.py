"""The worker's training loop: the synchronous contract of docs/DESIGN.md.

Per step: this worker's slice of the global batch -> its ``KeyedJaggedTensor``
(``data/features.py``; the default job's one fused table keeps the fused keys) -> each table's
unique ids, planned on the loader's thread -> the step pipeline reads their rows
(``pipelines/``: it waits for whatever commit the rows depend on) -> the rows are bound to the
model's collections (``step_rows.py``) -> the model's own forward and backward -> the pipeline
hands the unique rows' gradients to the PS -> all-reduce and apply the dense gradients.  Step
t+1 therefore reads rows that hold every worker's step-t update, and the
model equals a single-process run on the global batch.  The loop does not know which pipeline
runs.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from mpi4py import MPI

from cpu_dist.checkpoint.coordinator import Checkpointer, StopRequested, describe_owed
from cpu_dist.checkpoint.owner import Owner
from cpu_dist.common.config import Config
from cpu_dist.common.contracts import TABLE
from cpu_dist.common.mpi_context import Roles, wait_all
from cpu_dist.common.threads import ThreadChoice
from cpu_dist.common.timing import PhaseTimer
from cpu_dist.data import Batch, WorkerBatches, dataset_for, eval_batches
from cpu_dist.data.features import BatchFeatures
from cpu_dist.data.loader import JOIN_TIMEOUT_S, warm_first_share
from cpu_dist.data.run_length import run_length
from cpu_dist.dense.allreduce import broadcast_parameters
from cpu_dist.dense.sync import make_dense_sync
from cpu_dist.embeddings import (
    EmbeddingBagConfig,
    KeyedJaggedTensor,
    collections_of,
    table_ids_of,
    unique_ids,
)
from cpu_dist.export import export_job
from cpu_dist.models.factory import source_sha256
from cpu_dist.models.outputs import logits_of
from cpu_dist.models.scoring import load_scorer
from cpu_dist.sparse import Client
from cpu_dist.sparse.reads import TableReads
from cpu_dist.train import metrics, progress, summary
from cpu_dist.train.divergence import why_not_finite
from cpu_dist.train.dump import model_arrays, write_dump
from cpu_dist.train.errors import NonFiniteLoss
from cpu_dist.train.evaluation import evaluate_model
from cpu_dist.train.job_model import build_job_model, model_args, model_name
from cpu_dist.train.pipelines import CacheStage, make_committer, make_pipeline
from cpu_dist.train.start_notes import start_notes
from cpu_dist.train.step_rows import Plans, dense_named_parameters, distribute
from cpu_dist.train.thread_check import ThreadCheck, thread_notes
from cpu_dist.train.user_metric import load_metrics

# Workers meet after backward in a barrier that sleeps between polls: the wait for the slowest
# worker is reported on its own (t_straggler_wait) instead of inflating whichever collective
# comes first, and a waiting worker leaves its core to the others instead of spinning in MPI.
STRAGGLER_POLL_S = 1e-4

# This worker's slice of a batch: its features, each table's plan (sorted unique ids,
# inverse), the dense features and the labels.  The plan is bound to the model's collections
# only when its step runs, so the next step's batch may be taken early (a pipeline that pulls
# during the whole step).
Prepared = tuple[KeyedJaggedTensor, Plans, torch.Tensor, torch.Tensor]


def plan_batch(
    features: BatchFeatures, tables: list[EmbeddingBagConfig], batch: Batch
) -> tuple[KeyedJaggedTensor, Plans]:
    """A batch's features and every table's plan of them (a loader thread's work)."""
    kjt = features(batch)
    return kjt, {name: unique_ids(ids) for name, ids in table_ids_of(kjt, tables).items()}


def make_client(
    cfg: Config,
    token: str,
    addresses: list[str],
    compression: Literal["none", "fp16", "int8"] | None = None,
) -> Client:
    """The job's client of the shards; ``compression`` overrides ``--ps-compression``."""
    c = cfg.client
    # A job file's tables: the client moves each (name, dim); else today's one fused table.
    fused = cfg.tables.fused
    return Client(
        addresses,
        token,
        cfg.model.embedding_dim if fused else 0,
        table=TABLE,
        tables=None if fused else [(t.name, t.dim) for t in cfg.tables.tables],
        max_keys_per_rpc=c.max_keys_per_rpc,
        channels_per_shard=c.channels,
        timeout_s=c.rpc_timeout_s,
        max_message_bytes=c.max_message_bytes,
        compression=compression or c.compression,
    )


class Worker:
    """One worker's run: built from the Config, then :meth:`run`."""

    def __init__(
        self,
        cfg: Config,
        roles: Roles,
        token: str,
        session: int,
        addresses: list[str],
        owner: Owner | None = None,
        threads: ThreadChoice | None = None,
    ):
        self.cfg, self.comm = cfg, roles.comm
        self.rank, self.world = roles.role_rank, roles.role_size
        self.chief = self.rank == 0
        # --metric: worker 0 computes them; loaded and tried first, so a broken one stops the
        # job as it starts (MetricError: one line, exit 2), not at its first evaluation.
        self.user_metrics = load_metrics(cfg.output.metrics) if self.chief else []
        window = cfg.output.metric_window
        self.train_scores = metrics.TrainScores(window) if window else None
        if self.chief:  # worker 0 computes the train window's and the evaluations' figures
            load_scorer()
        self._logits: torch.Tensor | None = None  # the last step's, for train_scores
        self._eval_s = 0.0  # seconds in the evaluations during training (not in samples/s)
        self.dtype = torch.float64 if cfg.model.dtype == "float64" else torch.float32
        self.client = make_client(cfg, token, addresses)
        # Evaluation reads float32 rows on a client of its own, so that the bytes metrics
        # are the training's traffic alone (what --ps-compression changes).
        self.eval_client = make_client(cfg, token, addresses, compression="none")
        self.eval_reads = TableReads(self.eval_client, cfg.tables.names, cfg.tables.fused)
        self.dataset = dataset_for(cfg.data, cfg.train.seed)
        # The step count, decided once against the data; everything below sees it as max_step.
        self.length = run_length(cfg.train, cfg.data, self.dataset)
        cfg = self.cfg = dataclasses.replace(
            cfg, train=dataclasses.replace(cfg.train, max_step=self.length.steps)
        )
        # A fresh job starts at step 0: its first rows decode while the rest is built.
        self._warming = (
            None
            if cfg.checkpoint.resume or cfg.train.max_step == 0
            else warm_first_share(self.dataset, 0, cfg.train.batch_size, self.rank, self.world)
        )
        self.features = BatchFeatures(
            cfg.tables, self.dataset.kind, getattr(self.dataset, "offsets", None)
        )
        self._build_model()
        self.timer = PhaseTimer()
        self.committer = make_committer(cfg, self.client, self.comm, session)
        self.checkpointer = Checkpointer(
            cfg,
            self.comm,
            self.client,
            self.model,
            self.dense,
            self.committer,
            model_source_sha256=source_sha256(model_name(cfg)),
            owner=owner,
        )
        self.start = self.checkpointer.restore()  # --resume: rows, dense state; 0 otherwise
        self.committer.start_at(self.start)
        self.threads = ThreadCheck(self.comm, threads or ThreadChoice(1, "not chosen"), self.start)
        self.pipeline = make_pipeline(
            cfg, self.client, self.committer, self.comm, self.dataset, self.timer, self._unique
        )
        self.done = self.start >= cfg.train.max_step  # a resume of a finished run
        # (a finished run that leaves nothing owed leaves the earlier run's logs as they are)
        logs = self.chief and (not self.done or bool(self.checkpointer.owed))
        self.log = metrics.RunLog(
            cfg.output.metrics_out if logs else None,
            cfg.output.tensorboard if logs else None,
            run_id=self.checkpointer.run_id,  # a resumed run continues its log
            resume_at=self.start or None,
        )
        self.loss_fn = torch.nn.BCEWithLogitsLoss()
        if self._warming is not None:
            self._warming.join(JOIN_TIMEOUT_S)
        # This worker's shares, prepared ahead on a background thread (cpu_dist/data/loader.py).
        self._batches = WorkerBatches(
            self.dataset,
            cfg.train.batch_size,
            self.start,
            self.rank,
            self.world,
            stop_step=cfg.train.max_step,
            hold=True,  # no batch is made during this thread's data phase (see release below)
            prepare=self._plan,
        )

    def _build_model(self) -> None:
        """The user's model as written (or a built-in): its collections' rows become the ones
        the step pipeline reads (``step_rows``), everything else is dense, started from worker
        0's parameters and stepped by the dense sync."""
        cfg = self.cfg
        self.table_notes: list[str] = []  # TorchRec configs' optimizer and lr, said at start
        self.model = build_job_model(cfg, self.dataset.num_dense, self.table_notes)
        self.tables = [
            c for _, ebc in collections_of(self.model) for c in ebc.embedding_bag_configs()
        ]
        self.rows = distribute(self.model)
        dims = {c.name: c.embedding_dim for c in self.tables}
        self.traffic = summary.TableTraffic(dims)  # per table, for the summary
        broadcast_parameters(self.model, self.comm)
        self.dense = make_dense_sync(
            cfg.train.dense_sync,
            [p for _, p in dense_named_parameters(self.model)],
            self.comm,
            cfg.train.dense_optimizer,
            cfg.train.lr,
            cfg.train.dense_optimizer_args,
        )
        # The first optimizer imports torch's compiler stack (seconds), done at different times
        # on a loaded node: the workers meet asleep before their next collective, which would
        # spin the early ones' cores meanwhile.
        wait_all(self.comm, cfg.job.barrier_timeout_s, "worker start-up")

    def _unique(self, batch: Batch) -> dict[str, np.ndarray]:
        """A batch's sorted unique keys per table (the cache stage's prescan)."""
        return {name: unique for name, (unique, _) in self._plan(batch)[1].items()}

    def _plan(self, batch: Batch) -> tuple[KeyedJaggedTensor, Plans]:
        """A batch's features and each table's plan (on the loader's thread)."""
        return plan_batch(self.features, self.tables, batch)

    def _next_batch(self, release: bool = True) -> Prepared | None:
        """This worker's slice of the next global batch, or None when the data ends (every
        worker counts the same steps, so all stop at the same one) or at --max_step.
        ``release``: let the loader make the batch after it now (else the caller does)."""
        item = next(self._batches, None)
        if item is None:  # the loader's thread has ended (it stops itself at --max_step)
            self._batches.close()
            return None
        batch = item[1]  # already this worker's rows [r*B/W, (r+1)*B/W)
        kjt, plans = self._batches.prepared
        prepared = (
            kjt,
            plans,
            torch.from_numpy(batch.dense).to(self.dtype),
            torch.from_numpy(batch.labels).to(self.dtype),
        )
        if release:  # the loader makes the next batch during forward and backward
            self._batches.release()
        return prepared

    def _train_step(self, step: int, prepared: Prepared) -> tuple[torch.Tensor, Prepared | None]:
        """Returns the step's loss and, when the pipeline wanted it early, the next batch."""
        kjt, plan, dense, labels = prepared
        timer = self.timer
        rows = self.pipeline.read(step, {name: p[0] for name, p in plan.items()})
        self.rows.bind(plan, rows)
        self.traffic.add(plan)
        ahead = None
        if self.pipeline.prefetch_early and step + 1 < self.cfg.train.max_step:
            ahead = self._ahead(step)  # its rows are pulled during this whole step
        with timer("forward"):
            self.dense.zero_grad()
            logits = logits_of(self.model(dense, kjt), len(labels), self.cfg.model.name)
            self._logits = logits.detach()
            loss = self.loss_fn(logits, labels)
        if not torch.isfinite(loss):  # before backward: name the cause, not a sparse key
            raise NonFiniteLoss(
                why_not_finite(
                    self.model, self.cfg.train, self.rank, step, float(loss), rows, dense
                )
            )
        with timer("backward"):
            loss.backward()
        if self.world > 1:  # load imbalance, measured apart from the collectives that follow
            with timer("straggler_wait"):
                wait_all(
                    self.comm,
                    self.cfg.job.barrier_timeout_s,
                    f"step {step}: workers after backward",
                    poll_s=STRAGGLER_POLL_S,
                )
        with timer("push"):
            self.pipeline.submit(step, *self.rows.grads())
        return loss, ahead

    def _ahead(self, step: int) -> Prepared | None:
        """The batch of ``step + 1``, its keys handed to the pipeline to read ahead."""
        with self.timer("data"):
            ahead = self._next_batch(release=False)
        if ahead is not None:
            with self.timer("pull"):  # starting a read is reading (the catch-up's is not free)
                self.pipeline.prefetch(step + 1, {n: p[0] for n, p in ahead[1].items()})
        # The loader makes the batch after this one only now: started before the pulls, its
        # work took the CPU they needed (their 0.6 ms took 3-4 ms in the W=2 job, 1.5-2.5 after)
        self._batches.release()
        return ahead

    def _dense_step(self, step: int) -> None:
        with self.timer("allreduce"):  # reduce (or reduce-scatter) the dense gradients
            self.dense.reduce()
        with self.timer("optimizer"):  # (and all-gather the parameters, under reduce_scatter)
            t = self.cfg.train
            self.dense.step(None if t.schedule.constant else t.schedule.rate(t.lr, step))

    def _close(self, stop_shards: bool) -> None:
        """The workers' last meeting; worker 0 then stops the job's own shards."""
        self.log.close()
        wait_all(self.comm, self.cfg.job.barrier_timeout_s, "workers finishing")
        if self.chief and stop_shards:
            self.client.shutdown()

    def _nothing_to_do(self, stop_shards: bool) -> None:
        """A resume whose checkpoint is at or past the step count: a requeued job that had
        finished ends at once, successfully, touching nothing."""
        self._batches.close()
        self.pipeline.finish(self.start - 1)
        if self.chief:
            print(
                f"nothing to do: checkpoint at step {self.start}, --max_step "
                f"{self.cfg.train.max_step}",
                flush=True,
            )
        self.log.close()
        wait_all(self.comm, self.cfg.job.barrier_timeout_s, "workers finishing")
        if self.chief and stop_shards:
            self.client.shutdown()

    def run(self, stop_shards: bool) -> bool:
        """Trains; True when the job was asked to stop (and checkpointed where it stopped)."""
        cfg = self.cfg
        if self.done and not self.checkpointer.owed:
            self._nothing_to_do(stop_shards)
            return False
        if self.done:  # a stopped run's checkpoint after its last step: make what it owes
            self._batches.close()
        if self.chief:
            print(f"cpu_dist: {self._start_line()}", flush=True)
            threads = thread_notes(self.threads.choices, cfg.job.num_ps_ranks, cfg.job.worker_nice)
            for note in [] if self.done else start_notes(cfg, self.table_notes, threads):
                print(f"cpu_dist: {note}", flush=True)
        bar = progress.Progress(
            cfg.train.max_step, self.start, enabled=self.chief and cfg.output.progress
        )
        window = metrics.Window(time.perf_counter())
        run_t0 = self._run_t0 = time.perf_counter()
        steps, ahead, stopped = cfg.train.max_step, None, False
        for step in range(self.start, cfg.train.max_step):
            with self.timer("data"):
                prepared = ahead if ahead is not None else self._next_batch()
                ahead = None
            if prepared is None:
                steps = step
                break
            loss, ahead = self._train_step(step, prepared)
            if not self.pipeline.prefetch_early and step + 1 < cfg.train.max_step:
                ahead = self._ahead(step)  # the pipeline may start reading step + 1
            self._dense_step(step)
            if (slow := self.threads.after_step(step)) is not None and self.chief:
                print(f"cpu_dist: note: {slow}", flush=True)
            window.samples += cfg.train.batch_size
            window.add_loss(loss.item())
            if self.train_scores is not None and self._logits is not None:
                self.train_scores.add(self._logits.double().numpy(), prepared[3].double().numpy())
            self.checkpointer.after_step(step)  # --checkpoint-every: at this step boundary
            try:
                self._after_step(step, steps, loss, window, bar)
            except StopRequested:  # an evaluation stopped part way: checkpointed just below
                pass
            if self.checkpointer.stop_requested(step):  # SIGTERM, SIGUSR1; the last step too
                steps, stopped = step + 1, True
                break
        bar.close()
        with self.timer("commit_wait"):
            self.pipeline.finish(max(steps, self.start) - 1)
        if stopped:  # checkpointed: no evaluation or outputs, the resumed run makes them
            self._close(stop_shards)
        else:
            stopped = self._end(max(steps, self.start), time.perf_counter() - run_t0, stop_shards)
        return stopped

    def _start_line(self) -> str:
        if self.done:
            return (
                f"training is complete ({self.start:,} steps); making what the stopped run "
                f"owes: {describe_owed(self.checkpointer.owed)}"
            )
        return self.length.describe(self.start)

    def _after_step(
        self, step: int, steps: int, loss: torch.Tensor, window: metrics.Window, bar
    ) -> None:
        """The logged step's line (loss, samples/s, train AUC and NE, the learning rates, every
        counter) and progress; a periodic evaluation, whose time no samples/s counts."""
        out = self.cfg.output
        if (step + 1) % out.print_freq == 0 or step + 1 == steps:
            # the mean over the interval's steps and the workers (each a mean over its share)
            loss_sum = np.array(window.take_loss(), dtype=np.float64)
            self.comm.Allreduce(MPI.IN_PLACE, loss_sum)
            record = {"step": step + 1, "loss": float(loss_sum[0] / max(loss_sum[1], 1.0))}
            now = time.perf_counter()
            record["samples_per_s"] = window.rate(now)
            if self.train_scores is not None:
                record.update(self.train_scores.figures(self.comm))
            record.update(metrics.learning_rates(self.cfg, step))
            self.log.write(self._record(record))
            trained_s = now - self._run_t0 - self._eval_s
            done = (step + 1 - self.start) * self.cfg.train.batch_size
            bar.logged(step + 1, record["loss"], done / max(trained_s, 1e-9))
        bar.update()
        if out.eval_every and (step + 1) % out.eval_every == 0 and step + 1 < steps:
            t0 = time.perf_counter()
            self._evaluate(step + 1)
            spent = time.perf_counter() - t0
            self._eval_s += spent
            window.pause(spent)

    def _record(self, head: dict[str, Any]) -> dict[str, Any]:
        """A metrics record: ``head``, then every counter of the run so far."""
        phases = self.timer.totals()
        traffic = self.client.traffic()
        commits = self.committer.metrics()
        waits = phases.get("commit_wait", 0.0) if self.committer.background else None
        return {
            **head,
            **{f"t_{k}": v for k, v in phases.items()},
            "bytes_pulled": traffic["bytes_pulled"],
            "bytes_pushed": traffic["bytes_pushed"],
            "bytes_allreduced": self.dense.bytes_reduced,
            "dense_optimizer_state_bytes": self.dense.optimizer_state_bytes(),
            **commits,
            # The training thread's seconds in sparse reads, exchanges and commit waits (with a
            # background hand-off its own commit waits ran on that thread; the training thread
            # waited only inside its reads and in the loop's commit_wait phase).
            "exposed_sparse_s": phases.get("pull", 0.0)
            + commits["sparse_exchange_s"]
            + (commits["commit_wait_s"] if waits is None else waits),
            **self.pipeline.metrics(),
        }

    def _evaluate(self, step: int, split: str = "eval", final: bool = False) -> dict[str, float]:
        """Held-out AUC and log loss after ``step`` steps: ``--eval-batches`` batches of the
        eval split (the final evaluation: all of it unless the flag was given), or at the end
        ``--test-batches`` of the test split (where there is one).  Logged and printed."""
        self.pipeline.wait_readable(step)
        bs, out = self.cfg.train.batch_size, self.cfg.output
        if split == "eval":
            n = out.final_eval_batches if final else out.eval_batches
            batches = eval_batches(self.dataset, bs, n)
        else:
            batches = self.dataset.test_batches(bs, out.test_batches)
        result = evaluate_model(
            self.model,
            self.checkpointer.interruptible(batches, "final_eval" if final else split),
            self.comm,
            dtype=self.dtype,
            plan=self._plan,
            rows=self.rows,
            read_rows=self._eval_rows,
            prefix=split,
            timeout_s=self.cfg.job.barrier_timeout_s,
            model_name=self.cfg.model.name,
            user_metrics=self.user_metrics,
            user_keys=[m.key for m in self.user_metrics],
        )
        if result:
            self.log.write({"step": step, **result})
            progress.console(summary.eval_line(step, result))
        return result

    def _eval_rows(self, parts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """float32 rows of every table's keys, on the evaluation's own client."""
        return self.eval_reads.pull(parts)

    def _dump_arrays(self) -> dict[str, np.ndarray]:
        """The ``--dump-state`` arrays: the dense parameters and every table's rows."""
        if self.cfg.tables.fused:  # (the client's one table)
            keys, values, _ = self.client.dump()
            return model_arrays(self.model, {TABLE: (keys, values)})
        tables = {}
        for name in self.cfg.tables.names:
            keys, values, _ = self.client.dump(table=name)
            tables[name] = (keys, values)
        return model_arrays(self.model, tables)

    def _export(self, steps: int) -> None:
        """``--export``: the bundle of any model (its spec, arguments, tables and rows)."""
        assert self.cfg.output.export is not None
        export_job(
            self.cfg,
            self.model,
            self.client,
            steps,
            Path(self.cfg.output.export),
            dense_features=self.dataset.num_dense,
            name=model_name(self.cfg),
            args=model_args(self.cfg),
        )

    def _end(self, steps: int, run_s: float, stop_shards: bool) -> bool:
        """The outputs of a run whose training is complete (of a resume that finds it
        complete: what the stopped run's checkpoint owes), then the summary.  True when a
        stop was asked meanwhile: the checkpoint after the last step then records what is
        still owed, and the job exits 75."""
        ck = self.checkpointer
        left = list(ck.owed if self.done else ck.outputs)
        result: dict[str, float] = {}
        try:
            if "final_eval" in left:
                result = self._evaluate(steps, final=True)
                left.remove("final_eval")
            if "test" in left:
                result.update(self._evaluate(steps, "test"))
                left.remove("test")
            if ck.stop_agreed():  # before worker 0's own outputs, which no one can interrupt
                raise StopRequested("outputs")
        except StopRequested:
            ck.stop_owing(steps - 1, left)
            self._close(stop_shards)
            return True
        # Every worker's counters, gathered once (the workers have just met in the
        # evaluation): the summary keeps worker 0's under their names and adds the reduced
        # figures as <key>_sum, _max or _mean (summary.reduce_workers).
        counters = self._record({})
        everyone = self.comm.gather(counters, root=0)
        traffic = self.comm.gather(self.traffic, root=0)
        if self.chief:
            assert everyone is not None and traffic is not None
            if "dump_state" in left:
                assert self.cfg.output.dump_state is not None
                with ck.kept_alive("--dump-state"):
                    write_dump(self.cfg.output.dump_state, self._dump_arrays())
            if "export" in left:
                with ck.kept_alive("--export"):
                    self._export(steps)
            head: dict[str, Any] = {
                "steps": steps,
                "workers": self.world,
                "ps_shards": self.client.num_shards,
                "seconds": run_s,
                "samples_per_s": (steps - self.start)
                * self.cfg.train.batch_size
                / max(run_s, 1e-9),
                **result,
            }
            t = self.cfg.storage
            head.update(
                summary.table_figures(
                    self.client.stats(), t.memory_rows > 0, t.admit_after > 1 or t.expire_after > 0
                )
            )
            tables: dict[str, dict[str, float]] = head.setdefault("tables", {})
            for name, figures in summary.TableTraffic.figures(traffic, self.traffic.dims).items():
                tables.setdefault(name, {"dim": self.traffic.dims[name]}).update(figures)
            if isinstance(self.pipeline, CacheStage):  # worker 0's cache of each table
                for name, cached in self.pipeline.table_figures().items():
                    tables.setdefault(name, {}).update(cached)
            totals = {**head, **counters, **summary.reduce_workers(everyone)}
            self.log.write({"summary": totals})
            print(summary.summary_table(totals, self.cfg.output.verbose_summary), flush=True)
        # The other workers wait for worker 0's dump and export asleep, with the job's
        # timeout, before the stop agreement's Allreduce (which spins).
        wait_all(self.comm, self.cfg.job.barrier_timeout_s, "worker 0's outputs")
        stopped = ck.outputs_done(steps - 1)  # the last checkpoint owes nothing now
        self.log.close()
        wait_all(self.comm, self.cfg.job.barrier_timeout_s, "workers finishing")
        if self.chief and stop_shards:
            self.client.shutdown()
        return stopped


def train_worker(
    cfg: Config,
    roles: Roles,
    token: str,
    session: int,
    addresses: list[str],
    stop_shards: bool,
    owner: Owner | None = None,
    threads: ThreadChoice | None = None,
) -> bool:
    """True when the job stopped on request (``Worker.run``); ``owner``: world rank 0's hold
    on the checkpoint directory (the preflight's); ``threads``: this worker's torch threads
    (``common.threads.share_cores``)."""
    return Worker(cfg, roles, token, session, addresses, owner, threads).run(stop_shards)
