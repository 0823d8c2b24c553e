"""The promise: distributed synchronous training equals a single-process PyTorch run.

Real mpirun jobs with real PS ranks (launcher.py, --dump-state) against the single-process
reference (``cpu_dist.reference``: the job's model as written, local rows) on the same global
batches.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cpu_dist.data import make_dataset
from cpu_dist.train.metrics import read_summary

from .launch import SMALL, run_key, small_reference, train

pytestmark = pytest.mark.timeout(900)


def reference(sparse_optimizer: str, dense_optimizer: str = "sgd") -> dict:
    return small_reference(
        make_dataset("synthetic", seed=0),
        sparse_optimizer=sparse_optimizer,
        dense_optimizer=dense_optimizer,
    )


def assert_same_model(got: dict, want: dict, rtol: float, atol: float = 1e-6) -> None:
    assert set(got) == set(want), f"different entries: {set(got) ^ set(want)}"
    np.testing.assert_array_equal(got["table/embedding/keys"], want["table/embedding/keys"])
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=atol, err_msg=k)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("equivalence"), {}


@pytest.mark.parametrize("sparse_optimizer", ["sgd", "rowwise_adagrad"])
@pytest.mark.parametrize("workers,shards", [(1, 1), (2, 1), (3, 1), (1, 2), (2, 2), (3, 2)])
def test_distributed_equals_single_process(runs, workers, shards, sparse_optimizer):
    tmp, cache = runs
    want = cache.setdefault(("ref", sparse_optimizer), reference(sparse_optimizer))
    got = train(
        tmp,
        f"w{workers}p{shards}-{sparse_optimizer}",
        workers,
        shards,
        ["--sparse-optimizer", sparse_optimizer],
    )
    cache[(workers, shards, sparse_optimizer)] = got
    assert len(got["table/embedding/keys"]) > 100
    assert_same_model(got, want, rtol=1e-5)


@pytest.mark.parametrize("sparse_optimizer", ["sgd", "rowwise_adagrad"])
def test_shard_count_changes_no_bit(runs, sparse_optimizer):
    tmp, cache = runs
    for w in (1, 2, 3):
        one = cache.get((w, 1, sparse_optimizer)) or train(
            tmp, f"b{w}p1", w, 1, ["--sparse-optimizer", sparse_optimizer]
        )
        two = cache.get((w, 2, sparse_optimizer)) or train(
            tmp, f"b{w}p2", w, 2, ["--sparse-optimizer", sparse_optimizer]
        )
        for k in one:
            np.testing.assert_array_equal(one[k], two[k], err_msg=f"W={w} {k}")


def test_same_run_twice_same_bits(runs):
    """Two runs of one job: the session's (shared with the AdamW tests below) and a fresh one."""
    tmp, _ = runs
    a = train(tmp, "twice-a", 2, 1, ["--dense-optimizer", "adamw"])
    b = train(tmp, "twice-b", 2, 1, ["--dense-optimizer", "adamw"], fresh=True)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_adamw_and_float64(runs):
    tmp, _ = runs
    want = reference("sgd", dense_optimizer="adamw")
    got = train(tmp, "adamw", 2, 1, ["--dense-optimizer", "adamw"])
    # Adam divides by sqrt(v): for a weight whose gradient is ~0, the last-bit difference of a
    # W-way sum against a one-process sum becomes an O(lr) step, so only an absolute bound of
    # a fraction of one step holds; SGD and row-wise Adagrad are held to rtol 1e-5 above.
    assert_same_model(got, want, rtol=1e-3, atol=1e-4)
    got64 = train(tmp, "f64", 2, 1, ["--dtype", "float64"])
    assert got64["dense/top.0.weight"].dtype == np.float64


@pytest.mark.parametrize("sparse_optimizer", ["sgd", "rowwise_adagrad"])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_collective_aggregation_equals_reference_and_ps_mode(runs, workers, sparse_optimizer):
    tmp, cache = runs
    want = cache.setdefault(("ref", sparse_optimizer), reference(sparse_optimizer))
    got = train(
        tmp,
        f"coll-w{workers}-{sparse_optimizer}",
        workers,
        2,
        ["--sparse-optimizer", sparse_optimizer, "--aggregation", "collective"],
    )
    assert_same_model(got, want, rtol=1e-5)
    ps_mode = cache.get((workers, 2, sparse_optimizer))
    if ps_mode is None:
        ps_mode = train(
            tmp,
            f"ps-w{workers}-{sparse_optimizer}",
            workers,
            2,
            ["--sparse-optimizer", sparse_optimizer],
        )
    assert_same_model(got, ps_mode, rtol=1e-5)


def test_reduce_scatter_dense_path_equals_the_reference_and_allreduce(runs):
    """ZeRO-1 (--dense-sync reduce_scatter) on an odd worker count (uneven slices, padding):
    the same model as the reference under SGD; as the allreduce path under AdamW (whose
    normalisation magnifies last-bit differences of near-zero gradients)."""
    tmp, cache = runs
    want = cache.setdefault(("ref", "sgd"), reference("sgd"))
    rs = ["--dense-sync", "reduce_scatter"]
    assert_same_model(train(tmp, "rs-w3", 3, 1, rs), want, rtol=1e-5)
    adamw = ["--dense-optimizer", "adamw"]
    ar = train(tmp, "ar-adamw-w2", 2, 1, adamw)
    assert_same_model(train(tmp, "rs-adamw-w2", 2, 1, [*rs, *adamw]), ar, rtol=1e-4)


def test_barrier_and_pipelined_give_the_same_bits(runs):
    tmp, cache = runs
    pipelined = cache.get((2, 1, "sgd")) or train(tmp, "pipe", 2, 1, [])
    barrier = train(tmp, "barrier", 2, 1, ["--sparse-sync", "barrier"])
    for k in pipelined:
        np.testing.assert_array_equal(pipelined[k], barrier[k], err_msg=k)


def test_a_sole_worker_reads_its_own_rows_and_gives_the_barrier_bits(runs):
    """One worker (SGD, ps aggregation, pipelined) brings the rows its last two steps wrote
    forward itself and pulls only the others, waiting for no commit: the same bits as the
    barrier mode (which pulls every row after its commit), over two shards."""
    tmp, cache = runs
    sole = cache.get((1, 2, "sgd")) or train(tmp, "w1p2-sgd", 1, 2, ["--sparse-optimizer", "sgd"])
    barrier = train(tmp, "sole-barrier", 1, 2, ["--sparse-sync", "barrier"])
    for k in sole:
        np.testing.assert_array_equal(sole[k], barrier[k], err_msg=k)
    s = read_summary(tmp / "w1p2-sgd.metrics.jsonl")
    held, pulled = s["rows_held"], s["rows_pulled"]
    assert held > 0 and pulled > 0  # both halves of every read after the second
    assert held + pulled == s["rows_pushed"]  # every row it read, it wrote
    assert read_summary(tmp / "sole-barrier.metrics.jsonl").get("rows_held") is None


def test_real_criteo_rows_train_and_equal_the_reference(runs):
    """The 200-row Criteo sample through the whole stack: reader, hashing of hex values into
    the fused key space, two workers, two shards, against the reference on the same file."""
    tmp, _ = runs
    sample = Path(__file__).resolve().parents[2] / "cpu_dist/data/tests/data/criteo_sample.tsv"
    flags = [
        "--data",
        "criteo",
        "--data-path",
        str(sample),
        "--batch-size",
        "16",
        "--max_step",
        "8",
    ]
    got = train(tmp, "criteo", 2, 2, flags)
    want = small_reference(make_dataset("criteo", path=sample), steps=8, batch_size=16)
    assert (got["table/embedding/keys"] >> 32).max() == 25  # keys of all 26 features, fused
    assert_same_model(got, want, rtol=1e-5)


@pytest.mark.parametrize("sparse_optimizer", ["sgd", "rowwise_adagrad"])
def test_caught_up_reads_give_the_barrier_bits(runs, sparse_optimizer):
    """Under collective aggregation the pipelined and async modes pull each step's rows while
    the step before still runs, and the worker applies the commits they miss itself
    (cpu_dist/sparse/catch_up.py): both equal the barrier mode, whose reads come after every
    commit, bit for bit, and their summaries say the pulls lagged while the steps' rows did
    not."""
    tmp, _ = runs
    flags = ["--aggregation", "collective", "--sparse-optimizer", sparse_optimizer]
    barrier = train(
        tmp, f"coll-barrier-{sparse_optimizer}", 2, 2, [*flags, "--sparse-sync", "barrier"]
    )
    for mode in (["pipelined"], ["async", "--max-staleness", "2"]):
        name = f"coll-{mode[0]}-{sparse_optimizer}"
        log = tmp / f"{name}.jsonl"
        got = train(tmp, name, 2, 2, [*flags, "--sparse-sync", *mode, "--metrics-out", str(log)])
        for k in barrier:
            np.testing.assert_array_equal(got[k], barrier[k], err_msg=f"{mode[0]}: {k}")
        s = read_summary(log)
        assert s["rows_caught_up"] > 0 and s["pull_lag_max"] >= 1, mode[0]
        assert s["staleness_max"] == 0, mode[0]


def test_a_shared_run_is_the_same_job_and_nothing_else(tmp_path):
    """train() shares a run (tests/integration/launch.py) only between the same jobs: the same
    rank count, parsed flags (their order and a default named explicitly change nothing), data
    and environment; never a job with state beyond its dump and metrics."""

    def key(*extra: str, np_: int = 4, env: dict | None = None):
        out = ["--dump-state", str(tmp_path / f"{len(extra)}.npz")]
        return run_key(np_, ["--worker-num", "2", *SMALL, *extra, *out], env or {})

    coll = key("--aggregation", "collective", "--sparse-optimizer", "sgd")
    assert coll is not None
    named_default = ("--sparse-optimizer", "sgd", "--aggregation", "collective", "--sparse-sync")
    metrics = ("--metrics-out", str(tmp_path / "m.jsonl"))
    assert key(*named_default, "pipelined", *metrics) == coll
    assert key("--aggregation", "collective", "--sparse-sync", "barrier") != coll
    assert key("--aggregation", "collective", np_=3) != coll
    assert key("--aggregation", "collective", env={"GPU_CACHE_VERIFY": "1"}) != coll
    data = tmp_path / "a.tsv"
    data.write_text("1\t2\n")
    criteo = ("--data", "criteo", "--data-path", str(data))
    before = key(*criteo)
    assert before is not None
    data.write_text("1\t3\n")  # the same path, other data: another job
    assert key(*criteo) != before
    moved = tmp_path / "b.tsv"
    moved.write_text("1\t3\n")  # the same data under another path: the same job
    assert key("--data", "criteo", "--data-path", str(moved)) == key(*criteo)
    assert key("--checkpoint-dir", str(tmp_path / "ck")) is None
    assert key("--ps-ssd-dir", str(tmp_path / "ssd")) is None
    assert key("--ps-memory-rows", "-3", "--bogus") is None  # refused flags: not shared
