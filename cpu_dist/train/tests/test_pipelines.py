"""The step pipelines (cpu_dist/train/pipelines): one family over a job's tables, the default
job's one table included, chosen in one place for the committer and the pipeline; the async
prefetch against a real in-process shard holding a job file's two tables."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from cpu_dist.common.features import CATEGORICAL_FEATURES
from cpu_dist.common.flags import parse_args
from cpu_dist.common.timing import PhaseTimer
from cpu_dist.common.validate import validate
from cpu_dist.sparse import Server
from cpu_dist.train.loop import make_client
from cpu_dist.train.pipelines import (
    AsyncPrefetchPipeline,
    SoleWriterPipeline,
    make_committer,
    make_pipeline,
    sparse_mode,
)

pytestmark = pytest.mark.timeout(60)
TOKEN, LR, STEPS = "t", 0.5, 5
HALF = len(CATEGORICAL_FEATURES) // 2


def job_file(tmp_path) -> str:
    """Two tables of widths 4 and 8, SGD, splitting the features between them."""
    path = tmp_path / "job.toml"
    parts = [("a", 4, CATEGORICAL_FEATURES[:HALF]), ("b", 8, CATEGORICAL_FEATURES[HALF:])]
    path.write_text(
        "".join(
            f'[[tables]]\nname = "{n}"\ndim = {d}\nfeatures = {list(f)!r}\noptimizer = "sgd"\n'
            f"lr = {LR}\n\n"
            for n, d, f in parts
        )
    )
    return str(path)


def config(*flags: str):
    return validate(parse_args(list(flags)), 3)


@pytest.mark.parametrize(
    ("flags", "strategy", "exchange_ids", "background"),
    [
        ((), "early_pull", True, False),
        (("--sparse-sync", "barrier"), "direct", False, False),
        (("--sparse-sync", "async", "--max-staleness", "2"), "async_prefetch", True, False),
        (("--sparse-sync", "async", "--max-staleness", "0"), "direct", False, False),
        (("--aggregation", "collective"), "catch_up", False, True),
        (("--aggregation", "collective", "--ps-expire-after", "3"), "direct", False, False),
        (("--ps-expire-after", "3"), "direct", False, False),
        (("--worker-num", "1"), "sole_writer", False, True),
        (("--worker-num", "1", "--sparse-sync", "barrier"), "direct", False, False),
        (("--worker-num", "1", "--ps-compression", "fp16"), "early_pull", True, False),
        (("--worker-num", "1", "--ps-admit-after", "2"), "early_pull", True, False),
        (("--worker-num", "1", "--aggregation", "collective"), "catch_up", False, True),
    ],
)
@pytest.mark.parametrize("with_file", [False, True])
def test_one_mode_per_flags_whatever_the_tables(
    tmp_path, flags, strategy, exchange_ids, background, with_file
):
    """The default job and a job file's tables get the same strategy for the same flags
    (before, async with K >= 1 read a job file's tables directly, waiting for commit t-1-K)."""
    extra = ("--config", job_file(tmp_path)) if with_file else ()
    mode = sparse_mode(config(*flags, *extra))
    assert (mode.strategy, mode.exchange_ids, mode.background) == (
        strategy,
        exchange_ids,
        background,
    )


@pytest.fixture
def two_tables(tmp_path):
    """(cfg, client) of a job file's two tables, async K=1 under ps aggregation, on a real
    in-process shard."""
    cfg = config("--config", job_file(tmp_path), "--sparse-sync", "async", "--max-staleness", "1")
    server = Server(0, TOKEN, tables=cfg.tables.specs(cfg.train.seed))
    server.start()
    yield cfg, make_client(cfg, TOKEN, [server.address])
    server.stop(2)


def test_async_prefetch_reads_every_table_early_and_right(two_tables):
    """Every step reads rows 0..29 of both tables and writes 0..9: rows 10..29 come from the
    early pull and keep their first values; the written rows hold every commit up to t-2
    (K=1), each step's gradient distinct so that the count of commits a row holds shows."""
    cfg, client = two_tables
    committer = make_committer(cfg, client, MPI.COMM_SELF, session_id=7)
    pipe = make_pipeline(cfg, client, committer, MPI.COMM_SELF, None, PhaseTimer())  # type: ignore[arg-type]
    assert isinstance(pipe, AsyncPrefetchPipeline)
    read = np.arange(30, dtype=np.int64)
    written = read[:10]
    dims = cfg.tables.dims
    init = {n: client.pull_tables({n: read})[n].astype(np.float64) for n in dims}
    sums = np.cumsum([0.0] + [1.0 + step for step in range(STEPS)])  # after 0..n commits
    unique = dict.fromkeys(dims, read)
    for step in range(STEPS):
        rows = pipe.read(step, unique)
        for name, r in rows.items():
            got = r.numpy().astype(np.float64)
            np.testing.assert_array_equal(got[10:], init[name][10:])
            held = (init[name][:10] - got[:10]) / LR  # the sum of the steps applied
            n = int(np.abs(held[:, :1] - sums[None, :]).argmin(axis=1).min())
            np.testing.assert_allclose(held, sums[n], rtol=1e-5)
            assert n >= step - 1  # every commit up to step-2
        grads = {n: np.full((10, d), 1.0 + step, np.float32) for n, d in dims.items()}
        pipe.submit(step, dict.fromkeys(dims, written), grads)
        if step + 1 < STEPS:
            pipe.prefetch(step + 1, unique)
    pipe.finish(STEPS - 1)
    m = pipe.metrics()
    assert m["reads_early"] + m["reads_pulled_again"] == STEPS - 1  # step 0 had none
    assert m["reads_early"] >= 1
    after = client.pull_tables(dict.fromkeys(dims, written))
    for name in dims:
        np.testing.assert_allclose(after[name], init[name][:10] - LR * sums[-1], rtol=1e-5)


@pytest.mark.parametrize("with_file", [False, True])
def test_async_prefetch_counts_every_row_of_an_expiring_table_as_written(tmp_path, with_file):
    """Expiry may drop a row at any commit, a write no worker knows of: the async prefetch
    pulls none of such a table's rows early, for the default job's table as for a file's."""
    extra = ("--config", job_file(tmp_path)) if with_file else ()
    cfg = config("--sparse-sync", "async", "--max-staleness", "1", "--ps-expire-after", "3", *extra)
    if with_file:
        server = Server(0, TOKEN, tables=cfg.tables.specs(cfg.train.seed))
    else:
        server = Server(cfg.model.embedding_dim, TOKEN, init_scale=0.1)
    server.start()
    try:
        client = make_client(cfg, TOKEN, [server.address])
        committer = make_committer(cfg, client, MPI.COMM_SELF, session_id=3)
        pipe = make_pipeline(cfg, client, committer, MPI.COMM_SELF, None, PhaseTimer())  # type: ignore[arg-type]
        assert isinstance(pipe, AsyncPrefetchPipeline)
        assert pipe.unknown_writes == set(cfg.tables.names)
        pipe.finish(-1)
    finally:
        server.stop(2)


def test_a_sole_writer_reads_every_row_as_after_every_commit(tmp_path):
    """One worker, a job file's two SGD tables on a real in-process shard: each read (keys
    overlapping the last two steps', some new) equals a pull made after the commit it depends
    on, bit for bit; rows the last two steps wrote are the worker's own, and a prefetch for
    other keys is let go (that read pulls everything)."""
    cfg = config("--config", job_file(tmp_path), "--worker-num", "1")
    server = Server(0, TOKEN, tables=cfg.tables.specs(cfg.train.seed))
    server.start()
    try:
        client = make_client(cfg, TOKEN, [server.address])
        committer = make_committer(cfg, client, MPI.COMM_SELF, session_id=11)
        pipe = make_pipeline(cfg, client, committer, MPI.COMM_SELF, None, PhaseTimer())  # type: ignore[arg-type]
        assert isinstance(pipe, SoleWriterPipeline)
        rng = np.random.default_rng(3)
        dims = cfg.tables.dims
        steps = [{n: np.unique(rng.integers(0, 60 + 10 * s, 30)) for n in dims} for s in range(8)]
        for step, unique in enumerate(steps):
            rows = pipe.read(step, unique)
            if step + 1 < len(steps) and step % 2:  # the loop's order: before the submit
                pipe.prefetch(step + 1, steps[step + 1])
            committer.wait_applied(step - 1)
            want = client.pull_tables(unique)
            for name in dims:
                np.testing.assert_array_equal(rows[name].numpy(), want[name], err_msg=name)
            grads = {n: rng.standard_normal((len(unique[n]), d)).astype(np.float32)
                     for n, d in dims.items()}  # fmt: skip
            pipe.submit(step, unique, grads)
            if step + 1 < len(steps) and not step % 2:  # or after it
                hint = steps[step + 1] if step != 4 else {n: k[1:] for n, k in unique.items()}
                pipe.prefetch(step + 1, hint)
        pipe.finish(len(steps) - 1)
        m = pipe.metrics()
        read = sum(len(k) for u in steps for k in u.values())
        assert m["rows_held"] + m["rows_pulled"] == read
        assert m["rows_held"] > 0
        # step 0 and the read after the wrong hint pulled all their rows
        assert m["rows_pulled"] >= sum(len(k) for u in (steps[0], steps[5]) for k in u.values())
    finally:
        server.stop(2)
