"""The worker's training loop: the synchronous contract of DESIGN.md section 3.

Per step: this worker's slice of the global batch -> its unique keys -> (wait for the commit
those rows depend on) -> pull -> forward/backward -> commit the unique rows' gradients ->
all-reduce and apply the dense gradients.  Step t+1 therefore reads rows that hold every
worker's step-t update, and the model equals a single-process run on the global batch.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from mpi4py import MPI

from cpu_dist.checkpoint.coordinator import Checkpointer
from cpu_dist.common.config import mlp_widths
from cpu_dist.common.mpi_context import Roles, wait_all
from cpu_dist.data import eval_batches, make_dataset, train_batches
from cpu_dist.dense.allreduce import GradientBuckets, broadcast_parameters, make_dense_optimizer
from cpu_dist.models.dlrm import build_dlrm
from cpu_dist.models.embedding import ShardedEmbedding
from cpu_dist.sparse import Client
from cpu_dist.train import metrics
from cpu_dist.train.ps_rank import TABLE
from cpu_dist.train.row_prefetch import SplitPull
from cpu_dist.train.sparse_updates import SparseUpdater

PHASES = (
    "data",
    "pull",
    "forward",
    "backward",
    "straggler_wait",
    "allreduce",
    "optimizer",
    "push",
    "commit_wait",
)
# Workers meet after backward in a barrier that sleeps between polls: the wait for the slowest
# worker is reported on its own (t_straggler_wait) instead of inflating whichever collective
# comes first, and a waiting worker leaves its core to the others instead of spinning in MPI.
STRAGGLER_POLL_S = 1e-4


def make_client(args: argparse.Namespace, token: str, addresses: list[str]) -> Client:
    return Client(
        addresses,
        token,
        args.embedding_dim,
        table=TABLE,
        max_keys_per_rpc=args.ps_max_keys_per_rpc,
        channels_per_shard=args.ps_channels,
        timeout_s=args.rpc_timeout,
        max_message_bytes=args.ps_max_message_bytes,
    )


def dataset_from_args(args: argparse.Namespace):
    return make_dataset(
        args.data,
        path=args.data_path,
        seed=args.seed,
        zipf_exponent=args.zipf_exponent,
        skip_bad_lines=args.skip_bad_lines,
    )


def train_worker(
    args: argparse.Namespace,
    roles: Roles,
    token: str,
    session: int,
    addresses: list[str],
    stop_shards: bool,
) -> None:
    comm, rank, world = roles.comm, roles.role_rank, roles.role_size
    chief = rank == 0
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    client = make_client(args, token, addresses)
    dataset = dataset_from_args(args)
    embedding = ShardedEmbedding(client, args.embedding_dim)
    model = build_dlrm(
        embedding,
        num_dense=dataset.num_dense,
        num_sparse=dataset.num_sparse,
        dim=args.embedding_dim,
        bot_mlp=mlp_widths(args.arch_mlp_bot, "--arch-mlp-bot"),
        top_mlp=mlp_widths(args.arch_mlp_top, "--arch-mlp-top"),
        seed=args.seed,
        dtype=dtype,
    )
    broadcast_parameters(model, comm)
    buckets = GradientBuckets(model.dense_parameters(), comm)
    optimizer = make_dense_optimizer(args.dense_optimizer, model.dense_parameters(), args.lr)
    # Pipelined, uncached: step t+1's rows that step t did not write are pulled early.
    split_pull = args.sparse_sync == "pipelined" and args.read_mode != "bagpipe"
    updater = SparseUpdater(
        client,
        comm,
        session,
        lr=args.sparse_lr,
        optimizer=args.sparse_optimizer,
        aggregation=args.aggregation,
        sync=args.sparse_sync,
        timeout_s=args.rpc_timeout,
        track_written=split_pull,
        # the cache keeps its rows coherent, so its submit may overlap
        # the dense phase
        background=args.read_mode == "bagpipe",
    )
    checkpointer = Checkpointer(args, comm, client, model, optimizer, updater, TABLE)
    start = checkpointer.restore()  # --resume: rows, dense state; 0 otherwise
    updater.start_at(start)
    reader = None  # --read-mode bagpipe: the cache stage reads rows instead of client.pull
    if args.read_mode == "bagpipe":
        from gpu_cache import make_reader

        reader = make_reader(args, client, updater, comm, dataset)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    timer = metrics.PhaseTimer()
    log = metrics.RunLog(args.metrics_out if chief else None, args.tensorboard if chief else None)
    bar = metrics.progress(args.max_step, enabled=chief and not args.no_progress, initial=start)
    bytes_pulled = 0
    last_step = start - 1
    window_t0, window_samples = time.perf_counter(), 0
    run_t0 = time.perf_counter()

    batches = train_batches(dataset, args.batch_size, start)

    def next_batch():
        """This worker's slice of the next global batch, or None when a finite file ends."""
        item = next(batches, None)
        if item is None:  # every worker reads the same file, so all stop at the same step
            return None
        batch = item[1].shard(rank, world)
        keys = torch.from_numpy(batch.keys)
        return (
            keys,
            embedding.unique_keys(keys),
            torch.from_numpy(batch.dense).to(dtype),
            torch.from_numpy(batch.labels).to(dtype),
        )

    pool = ThreadPoolExecutor(1, thread_name_prefix="row-prefetch") if split_pull else None
    ahead = None  # the next step's batch when it was read during this step
    early = None  # its SplitPull
    steps = args.max_step
    for step in range(start, args.max_step):
        with timer("data"):
            prepared = ahead if ahead is not None else next_batch()
            ahead = None
            if prepared is None:
                steps = step
                break
            keys, unique, dense, labels = prepared
        if reader is not None:  # the cache waits only for the commits its misses depend on
            with timer("pull"):
                rows = reader.read(step, unique)
            bytes_pulled = reader.bytes_pulled
        else:
            with timer("commit_wait"):
                updater.wait_readable(step)
            with timer("pull"):
                rows = torch.from_numpy(
                    early.finish() if early is not None else client.pull(unique)
                )
                early = None
                bytes_pulled += unique.nbytes + rows.numel() * 4
        with timer("forward"):
            buckets.zero()
            logits = model(dense, keys, rows=rows)
            loss = loss_fn(logits, labels)
        with timer("backward"):
            loss.backward()
        if world > 1:  # load imbalance, measured apart from the collectives that follow
            with timer("straggler_wait"):
                wait_all(
                    comm,
                    args.rpc_timeout,
                    f"step {step}: workers after backward",
                    poll_s=STRAGGLER_POLL_S,
                )
        with timer("push"):
            sparse_keys, sparse_grads = embedding.sparse_grads()
            # the cache stage submits through the updater and keeps its rows coherent
            (reader or updater).submit(step, sparse_keys, sparse_grads)
        if split_pull and step + 1 < args.max_step:
            with timer("data"):
                ahead = next_batch()
            if ahead is not None:
                early = SplitPull(client, pool, ahead[1], updater.written, args.rpc_timeout)
        with timer("allreduce"):
            buckets.allreduce_mean()
        with timer("optimizer"):
            optimizer.step()
        last_step = step
        window_samples += args.batch_size
        checkpointer.after_step(step)  # --checkpoint-every: at this committed step boundary

        if (step + 1) % args.print_freq == 0 or step + 1 == steps:
            loss_sum = np.array([loss.item()], dtype=np.float64)
            comm.Allreduce(MPI.IN_PLACE, loss_sum)
            now = time.perf_counter()
            rate = window_samples / max(now - window_t0, 1e-9)
            window_t0, window_samples = now, 0
            record = {
                "step": step + 1,
                "loss": float(loss_sum[0] / world),
                "samples_per_s": rate,
                **{f"t_{k}": v for k, v in timer.totals().items()},
                "bytes_pulled": bytes_pulled,
                "bytes_pushed": updater.payload_bytes,
                "bytes_allreduced": buckets.bytes_reduced,
                "commit_wait_s": updater.commit_wait_s,
                "rows_pushed": updater.rows_sent,
                **(reader.metrics() if reader is not None else {}),
            }
            log.write(record)
            bar.set_postfix(loss=f"{record['loss']:.4f}", sps=f"{rate:,.0f}")
        bar.update(1)
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.max_step:
            _evaluate(args, model, embedding, dataset, updater, comm, step + 1, log, dtype)
    bar.close()
    if pool is not None:
        pool.shutdown(wait=True)
    with timer("commit_wait"):
        updater.finish(last_step)
    if reader is not None:
        reader.close()
    run_s = time.perf_counter() - run_t0
    result = _evaluate(args, model, embedding, dataset, updater, comm, steps, log, dtype)

    if chief:
        if args.dump_state:
            dump_state(args.dump_state, model, client)
        summary = {
            "steps": steps,
            "workers": world,
            "ps_shards": client.num_shards,
            "seconds": run_s,
            "samples_per_s": steps * args.batch_size / max(run_s, 1e-9),
            "bytes_pulled": bytes_pulled,
            "bytes_pushed": updater.payload_bytes,
            "bytes_allreduced": buckets.bytes_reduced,
            "commit_wait_s": updater.commit_wait_s,
            "sparse_exchange_s": updater.exchange_s,
            "exposed_sparse_s": _exposed_sparse_s(timer.totals(), updater),
            **result,
            **(reader.metrics() if reader is not None else {}),
            **{f"t_{k}": v for k, v in timer.totals().items()},
        }
        log.write({"summary": summary})
        print(metrics.summary_table(summary), flush=True)
    log.close()
    wait_all(comm, args.rpc_timeout * 10, "workers finishing")
    if chief and stop_shards:
        client.shutdown()


def _exposed_sparse_s(phases: dict[str, float], updater: SparseUpdater) -> float:
    """The training thread's seconds in sparse reads, exchanges and commit waits.  With a
    background hand-off the updater's own commit waits ran on that thread; the training thread
    waited only inside its reads (the pull phase) and in the loop's commit_wait phase."""
    waits = phases.get("commit_wait", 0.0) if updater.background else updater.commit_wait_s
    return phases.get("pull", 0.0) + updater.exchange_s + waits


def _evaluate(args, model, embedding, dataset, updater, comm, step, log, dtype) -> dict:
    """Held-out AUC and log loss: each worker scores its slice, worker 0 computes the metric."""
    rank, world = comm.Get_rank(), comm.Get_size()
    updater.wait_readable(step)
    scores, labels = [], []
    model.eval()
    with torch.no_grad():
        for batch in eval_batches(dataset, args.batch_size, args.eval_batches):
            part = batch.shard(rank, world)
            keys = torch.from_numpy(part.keys)
            rows = torch.from_numpy(embedding.store.pull(embedding.unique_keys(keys)))
            logits = model(torch.from_numpy(part.dense).to(dtype), keys, rows=rows)
            scores.append(logits.double().numpy())
            labels.append(part.labels.astype(np.float64))
    model.train()
    s = np.concatenate(scores) if scores else np.zeros(0)
    y = np.concatenate(labels) if labels else np.zeros(0)
    gathered = comm.gather((s, y), root=0)
    if rank != 0:
        return {}
    s = np.concatenate([g[0] for g in gathered])
    y = np.concatenate([g[1] for g in gathered])
    result = {f"eval_{k}": v for k, v in metrics.evaluate(s, y).items()} if len(y) else {}
    log.write({"step": step, **result})
    return result


def dump_state(path: str, model: torch.nn.Module, client: Client) -> None:
    """The --dump-state format: dense/<name> per dense parameter, sparse_keys (int64, sorted),
    sparse_values (float32, same order) for every row the PS holds (every row ever updated)."""
    keys, values, _ = client.dump()
    arrays = {
        f"dense/{name}": p.detach().numpy().copy() for name, p in model.dense_named_parameters()
    }
    arrays["sparse_keys"] = keys
    arrays["sparse_values"] = values
    tmp = path + ".tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
