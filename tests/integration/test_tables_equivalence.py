"""Jobs of many tables (``--config``) equal the single-process reference with the same tables.

The 26-table Criteo job (``cpu_dist/examples/criteo_tables.toml``) on the Criteo sample, with
W in {1, 2, 3} workers and P in {1, 2} shards: every run equals the reference (each table's
rows from its salted ``row_init``, its own optimizer), one shard count equals the other bit
for bit, and the worker counts agree to rounding.  A job of tables with widths 4, 16 and 64,
the three optimizers and features that share a table, likewise (its model projects the
widths to the interaction's, ``proj.<i>``), and its reads caught up on the worker under
collective aggregation equal the barrier mode's bit for bit.  Real mpirun jobs, real PS
ranks; the runs are few (each costs seconds of start-up) and shared between assertions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cpu_dist.common.flags import parse_args
from cpu_dist.common.validate import validate
from cpu_dist.data import make_dataset
from cpu_dist.reference import train_reference
from cpu_dist.train.dump import table_rows
from cpu_dist.train.metrics import read_summary

from .job_files import three_tables
from .launch import SMALL, train

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "cpu_dist/data/tests/data/criteo_sample.tsv"
EXAMPLE = ROOT / "cpu_dist/examples/criteo_tables.toml"
CRITEO = ["--data", "criteo", "--data-path", str(SAMPLE), "--batch-size", "12", "--max_step", "8"]
# 26 tables of width 64: the bottom MLP ends at 64 (the interaction's width)
CRITEO_TABLES = ["--config", str(EXAMPLE), "--arch-mlp-bot", "16-64", *CRITEO]

MIXED_TOML = three_tables(
    narrow={"lr": 0.2},
    mid={"lr": 0.05, "num_embeddings": 500},
    wide={"lr": 0.01, "init_scale": 0.05},
)


def _config(flags: list[str], workers: int, shards: int):
    args = parse_args(["--worker-num", str(workers), *SMALL, *flags])
    return validate(args, workers + shards)


def reference(flags: list[str], steps: int, batch_size: int, **data) -> dict:
    """The single-process reference with the job's tables (parsed as the job parses them)."""
    cfg = _config([*flags, "--batch-size", str(batch_size)], 1, 1)
    return train_reference(cfg, make_dataset(**data), steps)


def assert_close(got: dict, want: dict, rtol: float, atol: float = 1e-6, what: str = "") -> None:
    assert set(got) == set(want), f"{what}: different entries: {set(got) ^ set(want)}"
    for name, (keys, _) in table_rows(want).items():
        np.testing.assert_array_equal(table_rows(got)[name][0], keys, err_msg=f"{what}: {name}")
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=atol, err_msg=f"{what}: {k}")


def assert_same_bits(a: dict, b: dict, what: str) -> None:
    assert set(a) == set(b), what
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=f"{what}: {k}")


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("tables")


def test_the_26_table_criteo_job_equals_the_reference_for_any_workers_and_shards(tmp):
    """All six (W, P) of W in {1, 2, 3}, P in {1, 2}: the reference is computed once and the
    six runs are shared by every relation checked."""
    want = reference(CRITEO_TABLES, 8, 12, kind="criteo", path=SAMPLE)
    assert len(table_rows(want)) == 26
    runs = {}
    for workers in (1, 2, 3):
        for shards in (1, 2):
            name = f"criteo-w{workers}p{shards}"
            log = tmp / f"{name}.jsonl"
            runs[workers, shards] = got = train(
                tmp, name, workers, shards, [*CRITEO_TABLES, "--metrics-out", str(log)]
            )
            assert_close(got, want, rtol=1e-5, what=name)
    for workers in (1, 2, 3):
        # a table's rows spread over the shards by its own hash: another count, the same bits
        assert_same_bits(runs[workers, 1], runs[workers, 2], f"W={workers}: P=1 vs P=2")
        if workers > 1:
            for shards in (1, 2):
                assert_close(
                    runs[workers, shards],
                    runs[1, shards],
                    rtol=1e-5,
                    what=f"P={shards}: W={workers} vs W=1",
                )
    # the summary's tables object: each table's rows, summed over the shards
    for name in ("criteo-w1p1", "criteo-w2p2"):
        tables = read_summary(tmp / f"{name}.jsonl")["tables"]
        assert {n: t["rows"] for n, t in tables.items()} == {
            n: len(keys) for n, (keys, _) in table_rows(want).items()
        }, name


def test_tables_of_three_widths_and_optimizers_equal_the_reference(tmp):
    job = tmp / "mixed.toml"
    job.write_text(MIXED_TOML)
    flags = ["--config", str(job), "--max_step", "10", "--batch-size", "48"]
    want = reference(flags, 10, 48, kind="synthetic", seed=0)
    rows = table_rows(want)
    assert {n: v.shape[1] for n, (_, v) in rows.items()} == {"narrow": 4, "mid": 16, "wide": 64}
    assert rows["mid"][0].max() < 500  # num_embeddings folded the ids
    for workers, shards in ((1, 1), (3, 2)):
        name = f"mixed-w{workers}p{shards}"
        got = train(tmp, name, workers, shards, flags)
        # Adagrad's first step divides by |g|: rounding of the sums shows more there
        assert_close(got, want, rtol=1e-4, atol=1e-5, what=name)

    # Collective aggregation: async reads caught up on the worker, per table (row steps,
    # Adagrad's [n, dim] states), on two shards, equal the barrier mode on one, bit for bit.
    coll = [*flags, "--aggregation", "collective"]
    barrier = train(tmp, "mixed-coll-barrier", 2, 1, [*coll, "--sparse-sync", "barrier"])
    assert_close(barrier, want, rtol=1e-4, atol=1e-5, what="mixed collective barrier")
    log = tmp / "mixed-coll-async.jsonl"
    caught_up = train(
        tmp,
        "mixed-coll-async",
        2,
        2,
        [*coll, "--sparse-sync", "async", "--max-staleness", "2", "--metrics-out", str(log)],
    )
    assert_same_bits(caught_up, barrier, "mixed: caught-up async (P=2) vs barrier (P=1)")
    s = read_summary(log)
    assert s["rows_caught_up"] > 0 and s["staleness_max"] == 0, s


def test_async_under_ps_aggregation_pulls_every_tables_rows_early(tmp):
    """``--sparse-sync async`` (K >= 1) under ``ps`` aggregation pulls the rows a step did not
    write during the step before, for every table of a job file, as for the default job: the
    summary counts the early pulls used, the staleness stays within K, and the rows trained
    are the reference's (async changes values, not which rows exist)."""
    job = tmp / "mixed.toml"
    job.write_text(MIXED_TOML)
    flags = ["--config", str(job), "--max_step", "10", "--batch-size", "48"]
    want = reference(flags, 10, 48, kind="synthetic", seed=0)
    log = tmp / "mixed-ps-async.jsonl"
    got = train(
        tmp,
        "mixed-ps-async",
        2,
        2,
        [*flags, "--sparse-sync", "async", "--max-staleness", "1", "--metrics-out", str(log)],
    )
    s = read_summary(log)
    assert s["reads_early"] >= 1 and s["staleness_max"] <= 1, s
    for name, (keys, values) in table_rows(want).items():
        got_keys, got_values = table_rows(got)[name]
        np.testing.assert_array_equal(got_keys, keys, err_msg=name)
        assert got_values.shape == values.shape and np.isfinite(got_values).all(), name
