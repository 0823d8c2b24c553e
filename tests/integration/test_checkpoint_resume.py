"""Checkpoints under real mpirun jobs: a resumed run ends with the same bits as one that was
never interrupted -- into another shard count (1 -> 3 -> 1), and after a kill -9 -- and a bad
checkpoint stops the job with a message naming the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cpu_dist.common.metrics_log import read_log

from .jobctl import Job
from .launch import SMALL, assert_dumps_close, assert_dumps_equal, mpirun, train

pytestmark = pytest.mark.timeout(400)
# Adaptive optimizers on both sides, so optimizer state must survive the restart too.
OPT = ["--dense-optimizer", "adamw", "--sparse-optimizer", "rowwise_adagrad"]


def ckpt(d: Path, every: int) -> list[str]:
    return ["--checkpoint-dir", str(d), "--checkpoint-every", str(every)]


def steps_in(d: Path) -> list[int]:
    return sorted(json.loads(m.read_text())["step"] for m in d.glob("step-*/manifest.json"))


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """The uninterrupted run the resumed ones end equal to: 30 steps (W=2, P=1)."""
    return train(tmp_path_factory.mktemp("full"), "full30", 2, 1, [*OPT, "--max_step", "30"])


@pytest.fixture(scope="module")
def plain16(tmp_path_factory):
    """An uninterrupted 16-step run without the cache stage, which changes no bit
    (test_cache_equivalence.py)."""
    return train(tmp_path_factory.mktemp("plain"), "plain16", 2, 1, ["--max_step", "16"])


def test_resume_across_shard_counts_gives_the_same_bits(full, tmp_path):
    """... and one --metrics-out: each resume drops the lines its run does again (steps 11-12
    and the summary, then 16) and appends, so the log holds every step once."""
    d, log = tmp_path / "ck", ["--metrics-out", str(tmp_path / "m.jsonl")]
    # 1 shard: steps 0..11, checkpoints after steps 4 and 9 (and a resume stops at 9)
    train(tmp_path, "a", 2, 1, [*OPT, "--max_step", "12", *ckpt(d, 5), *log])
    assert steps_in(d) == [4, 9]
    # 3 shards: resume at step 10, run to 16, checkpoint after 14 (rows re-partitioned 1 -> 3)
    train(tmp_path, "b", 2, 3, [*OPT, "--max_step", "16", "--resume", *ckpt(d, 5), *log])
    assert steps_in(d) == [9, 14]  # --checkpoint-keep 2
    manifest = json.loads((d / "step-00000015" / "manifest.json").read_text())  # 15 steps
    assert manifest["num_shards"] == 3 and len(manifest["shards"]) == 3
    # 1 shard again: resume at 15 (3 -> 1), run to 30
    got = train(
        tmp_path,
        "c",
        2,
        1,
        [*OPT, "--max_step", "30", "--resume", "--checkpoint-dir", str(d), *log],
    )
    assert_dumps_equal(got, full, "resumed 3 -> 1 shards")
    written = read_log(tmp_path / "m.jsonl")
    assert written.run == manifest["run_id"]  # the header names the run, once, first
    assert [r["step"] for r in written.records if "loss" in r] == [5, 10, 15, 20, 25, 30]
    assert [r["step"] for r in written.records if "eval_auc" in r] == [30]
    assert [r["summary"]["steps"] for r in written.records if "summary" in r] == [30]


def test_resume_onto_another_dense_path_and_worker_count(full, tmp_path):
    """A checkpoint of the ZeRO-1 path (sharded optimizer state, gathered into the
    checkpoint) resumes on the allreduce path with another worker count."""
    d = tmp_path / "ck"
    rs = ["--dense-sync", "reduce_scatter"]
    train(tmp_path, "rs", 2, 1, [*OPT, *rs, "--max_step", "12", *ckpt(d, 10)])
    assert steps_in(d) == [9]
    got = train(
        tmp_path, "ar3", 3, 1, [*OPT, "--max_step", "30", "--resume", "--checkpoint-dir", str(d)]
    )
    # AdamW: last-bit sum-order differences are magnified (see there)
    assert_dumps_close(got, full, 1e-3, "reduce_scatter W=2 resumed at W=3", atol=1e-4)


def test_resume_with_reads_caught_up_on_the_worker(tmp_path):
    """Collective aggregation reads through the catch-up (rows pulled a step early, commits
    applied on the worker, row-wise Adagrad states with them): a resumed run, whose session
    starts at a later job step with nothing kept, ends with the same bits as one never
    interrupted."""
    d = tmp_path / "ck"
    flags = [*OPT, "--aggregation", "collective"]
    want = train(tmp_path, "whole", 2, 1, [*flags, "--max_step", "20"])
    train(tmp_path, "first", 2, 1, [*flags, "--max_step", "12", *ckpt(d, 5)])
    assert steps_in(d) == [4, 9]
    got = train(
        tmp_path,
        "resumed",
        2,
        1,
        [*flags, "--max_step", "20", "--resume", "--checkpoint-dir", str(d)],
    )
    assert_dumps_equal(got, want, "caught-up reads, resumed")


def test_resume_after_kill_gives_the_same_bits(full, tmp_path):
    d = tmp_path / "ck"
    job = Job(
        3,
        ["--worker-num", "2", *SMALL, *OPT, "--max_step", "100000", *ckpt(d, 3)],
        tmp_path / "killed.jsonl",
    )
    try:
        job.wait_for_steps(8, timeout=120)
        job.kill_rank(2)  # the PS shard
        rc, _, _err = job.finish(timeout=90)
    finally:
        job.kill_all()
    assert rc != 0
    done = steps_in(d)
    assert done and done[-1] < 29, done
    got = train(
        tmp_path,
        "resumed",
        2,
        1,
        [*OPT, "--max_step", "30", "--resume", "--checkpoint-dir", str(d)],
    )
    assert_dumps_equal(got, full, "resumed after a kill")


def test_bad_checkpoints_stop_the_job_naming_the_file(tmp_path):
    d = tmp_path / "ck"
    train(tmp_path, "a", 1, 1, ["--max_step", "4", *ckpt(d, 4)])
    step = d / "step-00000004"  # after 4 steps
    shard = step / "shard-00000-of-00001.bin"
    good = shard.read_bytes()

    def resume(extra=()) -> str:
        proc = mpirun(
            2,
            [
                "--worker-num",
                "1",
                *SMALL,
                "--max_step",
                "6",
                "--resume",
                "--checkpoint-dir",
                str(d),
                *extra,
            ],
            timeout=120,
        )
        assert proc.returncode != 0, proc.stdout[-2000:]
        assert "step 4" not in proc.stdout  # no training happened
        return proc.stderr

    shard.write_bytes(good[:-50])
    err = resume()
    assert f"checkpoint {shard}: truncated" in err, err[-3000:]
    shard.write_bytes(good)
    err = resume(["--embedding-dim", "16", "--arch-mlp-bot", "16-16"])
    want = f"checkpoint {step / 'manifest.json'}: table 'embedding': dim 8 in the checkpoint, 16"
    assert want in err, err[-3000:]
    # (flipped bytes, other versions, dense-file damage: cpu_dist/checkpoint/tests)
    (step / "manifest.json").write_text("{not json")
    err = resume()
    assert f"checkpoint {step / 'manifest.json'}: corrupt manifest" in err, err[-3000:]
    # An unfinished checkpoint (no manifest) is ignored: resume starts over.
    shutil.rmtree(step)
    (d / "step-00000005").mkdir()
    proc = mpirun(
        2,
        ["--worker-num", "1", *SMALL, "--max_step", "2", "--resume", "--checkpoint-dir", str(d)],
        timeout=120,
    )
    assert proc.returncode == 0 and "no complete checkpoint" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("prescan", [False, True])
def test_resume_with_the_cache_stage(plain16, tmp_path, prescan):
    """--read-mode bagpipe: the caches start empty after a restore, and the run still ends
    with the bits of an uninterrupted run (cached or not: the same bits)."""
    cache = [
        "--read-mode",
        "bagpipe",
        "--optimization-cache-capacity",
        "4",
        *(["--optimization-prescan"] if prescan else []),
    ]
    d = tmp_path / "ck"
    train(tmp_path, "a", 2, 1, [*cache, "--max_step", "10", *ckpt(d, 7)])
    assert steps_in(d) == [6]
    got = train(
        tmp_path, "b", 2, 1, [*cache, "--max_step", "16", "--resume", "--checkpoint-dir", str(d)]
    )
    assert_dumps_equal(got, plain16, "cached, resumed")


def test_a_fresh_run_does_not_take_a_directory_of_another_runs_checkpoints(tmp_path):
    d = tmp_path / "ck"
    train(tmp_path, "first", 1, 1, ["--max_step", "4", *ckpt(d, 2)])
    run_id = json.loads((d / "step-00000004" / "manifest.json").read_text())["run_id"]
    assert run_id
    proc = mpirun(2, ["--worker-num", "1", *SMALL, "--max_step", "4", *ckpt(d, 2)])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"--checkpoint-dir {d} already holds checkpoints of another run" in proc.stderr
    assert f"step-00000004, run {run_id}" in proc.stderr and "--resume" in proc.stderr
    assert steps_in(d) == [1, 3]  # nothing was pruned or written
    # --resume continues that run under its id, and prunes only its own checkpoints
    train(tmp_path, "second", 1, 1, ["--max_step", "8", "--resume", *ckpt(d, 2)])
    assert steps_in(d) == [5, 7]
    ids = {json.loads(m.read_text())["run_id"] for m in d.glob("step-*/manifest.json")}
    assert ids == {run_id}


def _tables_file(d: Path, sgd_lr: float = 0.1, c_optimizer: str = "sgd") -> Path:
    """Three tables of different optimizers (the job's model width, 8) over the 26 features."""

    def feats(lo: int, hi: int) -> str:
        return ", ".join(f'"cat_{i}"' for i in range(lo, hi))

    path = d / f"tables-{c_optimizer}.toml"
    path.write_text(
        f"""
[[tables]]
name = "a"
dim = 8
features = [{feats(0, 10)}]
optimizer = "adagrad"

[[tables]]
name = "b"
dim = 8
features = [{feats(10, 20)}]
optimizer = "rowwise_adagrad"

[[tables]]
name = "c"
dim = 8
features = [{feats(20, 26)}]
num_embeddings = 500
optimizer = "{c_optimizer}"
lr = {sgd_lr}
"""
    )
    return path


def test_a_job_of_several_tables_resumes_across_shard_counts(tmp_path):
    """Every table's rows, optimizer state and spec survive a checkpoint taken by 2 shards and
    restored by 3 (format 3: one file per shard holding all its tables): the resumed run ends
    with the bits of one never interrupted; a resume whose job file changes a table's spec is
    refused naming the table and the field."""
    job = ["--config", str(_tables_file(tmp_path)), "--dense-optimizer", "adamw"]
    whole = train(tmp_path, "whole", 2, 1, [*job, "--max_step", "14"])
    assert sorted(k for k in whole if k.startswith("table/")) == [
        f"table/{t}/{a}" for t in "abc" for a in ("keys", "values")
    ]
    d = tmp_path / "ck"
    train(tmp_path, "first", 2, 2, [*job, "--max_step", "8", *ckpt(d, 8)])
    manifest = json.loads((d / "step-00000008" / "manifest.json").read_text())
    assert [t["name"] for t in manifest["tables"]] == ["a", "b", "c"]
    assert manifest["tables"][2]["num_embeddings"] == 500
    got = train(
        tmp_path, "second", 2, 3, [*job, "--max_step", "14", "--resume", "--checkpoint-dir", str(d)]
    )
    assert_dumps_equal(got, whole, "tables, resumed 2 -> 3 shards")
    other = ["--config", str(_tables_file(tmp_path, c_optimizer="rowwise_adagrad"))]
    proc = mpirun(
        4,
        [
            "--worker-num", "2", *SMALL, *other, "--dense-optimizer", "adamw",
            "--max_step", "14", "--resume", "--checkpoint-dir", str(d),
        ],
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "table 'c': optimizer 'sgd' in the checkpoint, 'rowwise_adagrad' in this job" in (
        proc.stderr
    ), proc.stderr
