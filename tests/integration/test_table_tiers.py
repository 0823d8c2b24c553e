"""The PS table's tiers and step rules in whole jobs (issue 14): real mpirun jobs of
launcher.py with real PS ranks, and a real external shard process.

- A DRAM tier of a few dozen rows per shard in front of an SSD tier changes no bit of the
  trained model, and the SSD tier's working storage is gone after the job.
- Admission (--ps-admit-after) and expiry (--ps-expire-after) give the model, the row count
  and the rule counters of the single-process reference with the same rules.
- A resumed job keeps the rules' state (counts, last-update steps) and job steps.
- Without an SSD tier, a DRAM tier too small for the job stops it, naming the flags.
- An external shard whose rules differ from the job's is refused before training.

What one shard does with its tiers and rules is tested in cpu_dist/sparse/tests
(test_tiers.py, test_step_rules.py); this file holds the launcher's side of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpu_dist.common.contracts import TABLE
from cpu_dist.common.tokens import read_token_file, write_token_file
from cpu_dist.data import make_dataset, train_batches
from cpu_dist.embeddings import collections_of
from cpu_dist.reference import ReferenceTrainer
from cpu_dist.sparse import Client
from cpu_dist.testing.shards import standalone_shards
from cpu_dist.train.dump import table_keys_name

from .job_files import three_tables
from .launch import SMALL, assert_dumps_close, assert_dumps_equal, mpirun, reference_config, train

pytestmark = pytest.mark.timeout(300)
W, P = 2, 2  # workers, shards
MEMORY_ROWS = 40  # DRAM rows per shard of the tiered jobs (the table holds ~14,000 rows)
ADMIT, EXPIRE = 2, 3
KEYS = table_keys_name(TABLE)  # the default job's one table's keys in --dump-state


def summary_of(metrics: Path) -> dict:
    """The job's final ``{"summary": ...}`` line of --metrics-out."""
    lines = metrics.read_text(encoding="utf-8").splitlines()
    assert lines and lines[-1].startswith('{"summary"'), lines[-1:]
    return json.loads(lines[-1])["summary"]


def job(
    tmp: Path, name: str, extra: list[str], workers: int = W, shards: int = P
) -> tuple[dict, dict]:
    """(the --dump-state arrays, the metrics summary) of a job."""
    metrics = tmp / f"{name}.jsonl"
    got = train(tmp, name, workers, shards, [*extra, "--metrics-out", str(metrics)])
    return got, summary_of(metrics)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Jobs shared by the tests of this module (each made on first use)."""
    return tmp_path_factory.mktemp("tiers"), {}


def rules_flags(admit: int, expire: int) -> list[str]:
    return ["--ps-admit-after", str(admit), "--ps-expire-after", str(expire)]


# ---- 1. tiers never change the math --------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_a_small_dram_tier_with_an_ssd_tier_gives_the_bits_of_the_all_dram_job(
    runs, tmp_path, optimizer
):
    tmp, _ = runs
    opt = ["--sparse-optimizer", optimizer]
    dram, dram_summary = job(tmp, f"dram-{optimizer}", opt)
    ssd = tmp_path / "ssd"
    tier = ["--ps-memory-rows", str(MEMORY_ROWS), "--ps-ssd-dir", str(ssd)]
    tiered, s = job(tmp, f"tiered-{optimizer}", [*opt, *tier])
    assert_dumps_equal(tiered, dram, f"{optimizer}: SSD tier vs all-DRAM")
    # The tier was used: the rows did not fit in DRAM, went to SSD and were read back.
    rows = len(dram[KEYS])
    assert s["ps_rows"] == dram_summary["ps_rows"] == rows
    assert s["ps_rows_dram"] <= P * MEMORY_ROWS, s
    assert s["ps_rows_dram"] + s["ps_rows_ssd"] == rows, s
    assert s["ps_rows_ssd"] >= rows - P * MEMORY_ROWS > 0, s
    assert s["ps_ssd_bytes"] > 0 and s["ps_rows_read_ssd"] > 0, s
    assert "ps_rows_ssd" not in dram_summary  # the all-DRAM job has no tiers to report
    # Working storage: the shards' databases (shard-<i>-<pid>-<random>) go when they stop.
    assert list(ssd.rglob("*")) == []


TABLES_TOML = three_tables()
MEMORY_BYTES = 20_000  # per shard, over the three tables: a few dozen rows of ~14,000


def test_a_tiny_byte_budget_over_three_tables_gives_the_bits_of_the_all_dram_job(runs, tmp_path):
    tmp, _ = runs
    config = tmp_path / "tables.toml"
    config.write_text(TABLES_TOML, encoding="utf-8")
    flags = ["--config", str(config)]
    dram, dram_summary = job(tmp, "tables-dram", flags)
    ssd = tmp_path / "ssd"
    tier = ["--ps-memory-bytes", str(MEMORY_BYTES), "--ps-ssd-dir", str(ssd)]
    tiered, s = job(tmp, "tables-tiered", [*flags, *tier])
    assert_dumps_equal(tiered, dram, "tables: SSD tier vs all-DRAM")
    for name, t in s["tables"].items():  # every table went to SSD and came back
        rows = len(dram[table_keys_name(name)])
        assert t["rows"] == dram_summary["tables"][name]["rows"] == rows, name
        assert t["rows_dram"] + t["rows_ssd"] == rows, (name, t)
        assert t["rows_ssd"] > 0, (name, t)
    assert sorted(s["tables"]) == ["mid", "narrow", "wide"]
    assert list(ssd.rglob("*")) == []


# ---- 2. admission and expiry equal the reference --------------------------------------------


def rules_reference(optimizer: str, admit: int, expire: int, steps: int = 20):
    """(the reference's dump, its one table: ``LazyTable`` with the shard's counters) with the
    settings of SMALL, as test_equivalence's."""
    flags = ["--sparse-optimizer", optimizer, *rules_flags(admit, expire)]
    trainer = ReferenceTrainer(reference_config(flags), make_dataset("synthetic", seed=0))
    for step, batch in train_batches(trainer.dataset, trainer.cfg.train.batch_size):
        if step >= steps:
            break
        trainer.step(batch)
    ((_, ebc),) = collections_of(trainer.model)
    return trainer.dump(), ebc.row_source.tables[TABLE]


def rules_job(runs, optimizer: str, admit: int, expire: int) -> tuple[dict, dict]:
    """W workers and P shards; one worker where only expiry is on (the count of a key in
    several workers' shares of one step is admission's concern, and W = 2 covers it)."""
    tmp, cache = runs
    key = ("rules", optimizer, admit, expire)
    if key not in cache:
        cache[key] = job(
            tmp,
            f"rules-{optimizer}-a{admit}-e{expire}",
            ["--sparse-optimizer", optimizer, *rules_flags(admit, expire)],
            workers=W if admit > 1 else 1,
        )
    return cache[key]


@pytest.mark.parametrize(
    "optimizer,admit,expire",
    [("sgd", ADMIT, 0), ("rowwise_adagrad", 0, EXPIRE), ("rowwise_adagrad", ADMIT, EXPIRE)],
)
def test_admission_and_expiry_equal_the_reference(runs, optimizer, admit, expire):
    want, table = rules_reference(optimizer, admit, expire)
    got, s = rules_job(runs, optimizer, admit, expire)
    assert_dumps_close(got, want, 1e-5, f"{optimizer} admit {admit} expire {expire}")
    # The rules did something: rows were dropped, or ids are still waiting for admission
    assert len(want[KEYS]) == len(table) > 0
    if expire:
        assert table.rows_expired > 0
    if admit:
        assert table.pending_counts > 0
    assert s["ps_rows"] == len(want[KEYS]), s
    assert s["ps_rows_admitted"] == table.rows_admitted, s
    assert s["ps_rows_expired"] == table.rows_expired, s
    assert s["ps_pending_counts"] == table.pending_counts, s


# ---- 3. a resumed job keeps the rules --------------------------------------------------------


def test_a_resumed_job_keeps_the_rules_state_and_job_steps(runs, tmp_path):
    want, _ = rules_job(runs, "rowwise_adagrad", ADMIT, EXPIRE)  # 20 steps, uninterrupted
    d = tmp_path / "ck"
    flags = ["--sparse-optimizer", "rowwise_adagrad", *rules_flags(ADMIT, EXPIRE)]
    ckpt = ["--checkpoint-dir", str(d), "--checkpoint-every", "5"]
    # One shard: steps 0..11, checkpoints after steps 4 and 9; steps 10 and 11 are lost with
    # the job.  (The shard count changes no bit: test_equivalence.)
    _, first = job(tmp_path, "first", [*flags, "--max_step", "12", *ckpt], shards=1)
    manifests = sorted(json.loads(m.read_text())["step"] for m in d.glob("step-*/manifest.json"))
    assert manifests == [4, 9], manifests
    # The state to carry over is not trivial: counts pending and rows expired.
    assert first["ps_pending_counts"] > 0 and first["ps_rows_expired"] > 0, first
    # Resumed at step 10 into P shards (counts and last-update steps go with their partitions)
    # in a new commit session whose step 0 is job step 10.
    got, resumed = job(tmp_path, "resumed", [*flags, "--max_step", "20", "--resume", *ckpt])
    assert_dumps_equal(got, want, "rules, resumed")
    assert resumed["ps_rows"] == len(want[KEYS]), resumed


# ---- 4. a DRAM tier too small without an SSD tier ------------------------------------------


@pytest.mark.timeout(180)
def test_a_dram_tier_too_small_without_ssd_stops_the_job_naming_the_flags(tmp_path):
    out, metrics = tmp_path / "small.npz", tmp_path / "small.jsonl"
    args = ["--worker-num", "1", *SMALL, "--ps-memory-rows", "1000"]  # the table: ~14,000 rows
    proc = mpirun(2, [*args, "--metrics-out", str(metrics), "--dump-state", str(out)], timeout=150)
    assert proc.returncode != 0, proc.stdout[-2000:]
    err = proc.stderr
    assert "RESOURCE_EXHAUSTED" in err and "DRAM tier full" in err, err[-3000:]
    assert "--ps-memory-rows 1000" in err and "--ps-ssd-dir" in err, err[-3000:]
    assert not out.exists()  # the job did not end as if it had trained
    assert '{"summary"' not in (metrics.read_text() if metrics.exists() else "")


# ---- 5. an external shard with other rules ---------------------------------------------------


@pytest.mark.timeout(180)
def test_an_external_shard_without_the_jobs_admission_rule_is_refused(tmp_path):
    token = str(tmp_path / "token")
    write_token_file(token, "tiers-secret")
    with standalone_shards(token, 8, 1) as (addrs, _):  # started without --ps-admit-after
        proc = mpirun(
            1,
            [
                "--worker-num",
                "1",
                "--ps_list",
                addrs[0],
                "--token-file",
                token,
                *SMALL,
                "--ps-admit-after",
                "2",
            ],
            timeout=150,
        )
        client = Client(addrs, read_token_file(token), 8, timeout_s=30)
        try:
            (health,) = client.health()
        finally:
            client.close()
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = proc.stderr
    assert f"shard 0 of --ps_list ({addrs[0]}) does not match the job" in err, err[-3000:]
    assert "admit_after 0 (the job expects 2)" in err, err[-3000:]
    assert "--ps-admit-after" in err  # the message says how to start it
    assert health["rows"] == 0  # refused before anything was trained
