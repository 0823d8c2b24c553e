"""Any model, any features: jobs equal ``python -m cpu_dist.reference`` run on the same flags.

One job file holds every feature kind: tables of widths 4, 16 and 64 (the three optimizers),
features that share a table, multi-hot bags pooled by ``sum`` and by ``mean``, empty bags,
weighted multi-hot and weighted one-hot features (synthetic data, ``[data] bags`` and
``weights``).  The built-in ``dlrm`` over it runs for W in {1, 2, 3} x P in {1, 2}: every run
equals the reference (rtol 1e-4: Adagrad), the shard counts agree bit for bit.  The Adagrad
table's ``eps`` is 1e-6: with the default 1e-8, an element whose summed gradient nearly
cancels over a step's bags (``|g|`` about ``eps``) moves by ``lr * g / (|g| + eps)``, which
turns the summation-order rounding of ``g`` (one process against W workers' partial sums)
into a 1e-3 relative difference of that element (seen: 1 of 43,200 at W=3); default-eps
Adagrad over one-hot features is test_tables_equivalence's.  ``dcnv2`` and
a user's model loaded from a file outside the package (the two-tower example, copied) run at
W=2, P=2.  Real mpirun jobs, real PS ranks, the reference through its command line.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from cpu_dist.train.dump import table_rows
from cpu_dist.train.metrics import read_summary

from .job_files import three_tables
from .launch import assert_dumps_close as assert_close
from .launch import cli_reference as reference
from .launch import train

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
STEPS, BATCH = 6, 24

TABLE_KEYS = {
    "narrow": {"lr": 0.2},
    "mid": {"lr": 0.05, "num_embeddings": 500, "pooling": "mean"},
    "wide": {"lr": 0.01, "init_scale": 0.05, "eps": 1e-6},
}
DATA = """
[data]
kind = "synthetic"
bags = { cat_0 = [0, 4], cat_9 = [1, 6], cat_10 = [0, 3], cat_17 = [2, 5] }
weights = ["cat_0", "cat_18"]
"""
FEATURES_TOML = three_tables(**TABLE_KEYS) + DATA


def flags(job_file: Path, *extra: str) -> list[str]:
    """The job's flags after SMALL's (``launch.train`` puts SMALL first)."""
    return [
        "--config",
        str(job_file),
        "--max_step",
        str(STEPS),
        "--batch-size",
        str(BATCH),
        *extra,
    ]


@pytest.fixture(scope="module")
def job_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "features.toml"
    path.write_text(FEATURES_TOML)
    return path


def test_every_feature_kind_equals_the_reference_for_any_workers_and_shards(job_file, tmp_path):
    args = flags(job_file)
    want = reference(args, tmp_path / "reference.npz")
    assert set(table_rows(want)) == {"narrow", "mid", "wide"}
    runs = {}
    for workers in (1, 2, 3):
        for shards in (1, 2):
            got = train(tmp_path, f"w{workers}p{shards}", workers, shards, args)
            assert_close(got, want, 1e-4, f"W={workers} P={shards}")
            runs[workers, shards] = got
    for workers in (1, 2, 3):
        a, b = runs[workers, 1], runs[workers, 2]
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"W={workers}: P=1 vs P=2: {k}")


def test_dcnv2_equals_the_reference(job_file, tmp_path):
    args = flags(job_file, "--model", "dcnv2", "--dcn-num-layers", "2", "--dcn-low-rank-dim", "4")
    want = reference(args, tmp_path / "reference.npz")
    assert any(k.startswith("dense/crossnet.") for k in want)
    got = train(tmp_path, "dcnv2", 2, 2, args)
    assert_close(got, want, 1e-4, "dcnv2 W=2 P=2")


def test_a_user_model_from_a_file_outside_the_package_equals_the_reference(job_file, tmp_path):
    model = tmp_path / "my_models" / "towers.py"
    model.parent.mkdir()
    shutil.copy(ROOT / "cpu_dist/examples/user_model.py", model)
    args = flags(job_file, "--model", f"{model}:two_tower")
    want = reference(args, tmp_path / "reference.npz")
    assert any(k.startswith("dense/user.mlp.") for k in want)
    got = train(tmp_path, "two_tower", 2, 2, args)
    assert_close(got, want, 1e-4, "two_tower W=2 P=2")


OWN_NAMES_TOML = """
[[tables]]
name = "users"
dim = 4
features = ["user"]
num_embeddings = 5000
optimizer = "rowwise_adagrad"
lr = 0.1

[[tables]]
name = "items"
dim = 8
features = ["hist", "tags", "cat_3"]
pooling = "mean"
lr = 0.2

[data]
kind = "synthetic"
dense = 5
cardinalities = { tags = 300 }
bags = { hist = [0, 5] }
weights = ["tags"]
"""


def test_features_of_their_own_names_on_synthetic_data_equal_the_reference(tmp_path):
    """A job file's own feature names (``user``, ``hist``, ``tags``) beside one of the
    stream's (``cat_3``), a dense width of 5: the synthetic data makes them (the user's ids
    under its table's num_embeddings, the tags' under [data] cardinalities) and the job
    equals the reference."""
    job_file = tmp_path / "own.toml"
    job_file.write_text(OWN_NAMES_TOML)
    args = flags(job_file)
    want = reference(args, tmp_path / "reference.npz")
    assert want["dense/bot.0.weight"].shape[1] == 5
    assert 0 <= want["table/users/keys"].min() and want["table/users/keys"].max() < 5000
    got = train(tmp_path, "own", 2, 2, args)
    assert_close(got, want, 1e-4, "own feature names W=2 P=2")


RULES_TOML = (
    three_tables(
        narrow={**TABLE_KEYS["narrow"], "admit_after": 2},
        mid={**TABLE_KEYS["mid"], "expire_after": 3},
        wide=TABLE_KEYS["wide"],
    )
    + DATA
)


def test_admission_and_expiry_per_table_of_a_multi_hot_job_equal_the_reference(tmp_path):
    job_file = tmp_path / "rules.toml"
    job_file.write_text(RULES_TOML)
    args = flags(job_file)
    want = reference(args, tmp_path / "reference.npz")
    got = train(tmp_path, "rules", 2, 2, args)
    assert_close(got, want, 1e-4, "rules W=2 P=2")


def test_reads_caught_up_on_the_worker_equal_the_reference(job_file, tmp_path):
    """Pipelined commits under collective aggregation: the catch-up pipeline, every table."""
    args = flags(job_file, "--aggregation", "collective")
    want = reference(args, tmp_path / "reference.npz")
    got = train(tmp_path, "catch_up", 2, 2, args)
    assert_close(got, want, 1e-4, "catch-up W=2 P=2")


def test_a_tiny_dram_budget_equals_all_dram_bit_for_bit(job_file, tmp_path):
    """Rows of every width evicted to the SSD tier and read back: the same bits."""
    dram = train(tmp_path, "dram", 2, 2, flags(job_file))
    tiered = train(
        tmp_path,
        "tiered",
        2,
        2,
        flags(job_file, "--ps-memory-bytes", "20000", "--ps-ssd-dir", str(tmp_path / "ssd")),
    )
    assert set(dram) == set(tiered)
    for k in dram:
        np.testing.assert_array_equal(dram[k], tiered[k], err_msg=k)


@pytest.mark.parametrize(
    "mode",
    [["--sparse-sync", "async", "--max-staleness", "1"], ["--ps-compression", "fp16"]],
    ids=["async", "fp16"],
)
def test_async_and_compressed_multi_hot_jobs_train_every_table(job_file, tmp_path, mode):
    """Not equal to the reference by design (stale reads, rounded rows): every table is
    trained (each holds rows) and the model scores the held-out batches."""
    metrics = tmp_path / "m.jsonl"
    got = train(tmp_path, "mode", 2, 2, flags(job_file, *mode, "--metrics-out", str(metrics)))
    rows = table_rows(got)
    assert set(rows) == {"narrow", "mid", "wide"} and all(len(k) for k, _ in rows.values())
    summary = read_summary(metrics)
    assert summary["steps"] == STEPS and np.isfinite(summary["eval_auc"])


def test_the_cache_stage_over_a_multi_hot_fused_table_equals_the_reference(tmp_path):
    """``--read-mode bagpipe`` (prescan plans) with multi-hot bags of the flags' one fused
    table: the plans read the bags' keys as the steps do, and the cached rows stay the PS's
    (GPU_CACHE_VERIFY)."""
    job_file = tmp_path / "fused_bags.toml"
    job_file.write_text('[data]\nkind = "synthetic"\nbags = { cat_0 = [0, 4], cat_3 = [1, 6] }\n')
    args = ["--config", str(job_file), "--max_step", str(STEPS), "--batch-size", str(BATCH)]
    want = reference(args, tmp_path / "reference.npz")
    cache = ["--read-mode", "bagpipe", "--optimization-prescan"]
    got = train(tmp_path, "cached", 2, 2, [*args, *cache], env={"GPU_CACHE_VERIFY": "1"})
    assert_close(got, want, 1e-5, "cache W=2 P=2")


# The cache mirrors SGD only: every table trains with it here, the rest of every feature kind
# as above; "wide" has a cache of its own (one 64-row unit), the others share the budget.
CACHE_TABLE_KEYS = {
    "narrow": {"lr": 0.2, "optimizer": "sgd"},
    "mid": {"lr": 0.05, "num_embeddings": 500, "pooling": "mean", "optimizer": "sgd"},
    "wide": {"lr": 0.01, "init_scale": 0.05, "optimizer": "sgd", "cache_capacity": 1},
}
# 11 units of 64 rows at --embedding-dim 8: 22528 bytes, less wide's 64 rows of 64 floats
# (16384), leaves 6144 bytes: one unit for each of narrow and mid (64 * (4 + 16) * 4 = 5120).
CACHE_UNITS = "11"


@pytest.mark.parametrize(
    "mode",
    [
        ["--bagpipe-aggregation", "ps"],
        ["--bagpipe-aggregation", "collective", "--optimization-prescan"],
    ],
    ids=["online-ps", "prescan-collective"],
)
def test_the_cache_stage_per_table_equals_the_reference(tmp_path, mode):
    """A cache per table (``--read-mode bagpipe``) over every feature kind at W=2, P=2: equal
    to the reference, every cached row equal to its PS row at the end (GPU_CACHE_VERIFY), the
    capacity split as documented (``CacheConfig.table_units``), and caches that evict."""
    job_file = tmp_path / "cached_tables.toml"
    job_file.write_text(three_tables(**CACHE_TABLE_KEYS) + DATA)
    args = flags(job_file)
    want = reference(args, tmp_path / "reference.npz")
    metrics = tmp_path / "cached.jsonl"
    cache = ["--read-mode", "bagpipe", "--optimization-cache-capacity", CACHE_UNITS, *mode]
    got = train(
        tmp_path,
        "cached",
        2,
        2,
        [*args, *cache, "--optimization-bypass-below", "0", "--metrics-out", str(metrics)],
        env={"GPU_CACHE_VERIFY": "1"},
    )
    assert_close(got, want, 1e-5, f"cache per table W=2 P=2 {' '.join(mode)}")
    summary = read_summary(metrics)
    tables = summary["tables"]
    assert {n: tables[n]["cache_rows"] for n in tables} == {"narrow": 64, "mid": 64, "wide": 64}
    for name, t in tables.items():
        assert 0 < t["cache_hits"] < t["cache_lookups"], f"{name}: {t}"
    assert summary["cache_evictions"] > 0 and summary["cache_hits"] == sum(
        t["cache_hits"] for t in tables.values()
    )
