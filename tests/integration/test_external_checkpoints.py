"""Checkpoints of a job on standalone shards (``--ps_list``): each shard writes its file under
its own ``--checkpoint-dir`` as ``<run id>/step-N/shard-i-of-P.bin``, the job's manifest says
where, ``--resume`` (also into another shard count) reads them from there, two jobs on one
shard never share files, and a shard without a directory stops the job before it trains.
Real shard processes, real mpirun jobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpu_dist.serving.bundle import open_bundle
from cpu_dist.testing.shards import standalone_shards

from .launch import assert_dumps_equal, external_job, load_dump, run_module, train

pytestmark = pytest.mark.timeout(600)
DIM = 8  # SMALL's embedding dim


def job(token: str, addresses: list[str], *extra: str, workers: int = 2):
    return external_job(token, addresses, *extra, workers=workers)


def manifests(d: Path) -> dict[str, dict]:
    return {m.parent.name: json.loads(m.read_text()) for m in d.glob("step-*/manifest.json")}


def test_shards_without_a_directory_stop_the_job_before_it_trains(token, tmp_path):
    d = tmp_path / "ck"
    with standalone_shards(token, DIM, 2) as (addrs, _):
        proc = job(token, addrs, "--checkpoint-dir", str(d), "--checkpoint-every", "2")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"shard 0 of --ps_list ({addrs[0]}) has no checkpoint directory" in proc.stderr
    assert "--checkpoint-dir DIR" in proc.stderr
    assert not d.exists() or not any(d.iterdir())  # nothing created


def test_files_go_under_the_shards_directory_and_resume_into_another_shard_count(token, tmp_path):
    want = train(tmp_path, "whole", 2, 1, ["--max_step", "10"])
    job_dir, shard_dir = tmp_path / "ck", tmp_path / "shards"
    shard_dir.mkdir()
    flags = ["--checkpoint-dir", str(job_dir), "--checkpoint-every", "6"]
    with standalone_shards(token, DIM, 2, extra=["--checkpoint-dir", str(shard_dir)]) as (a, _):
        first = job(token, a, "--max_step", "7", *flags)
        assert first.returncode == 0, first.stderr[-3000:]
        # a second job on the same shards, another run: its own folder, the first's untouched
        (m,) = manifests(job_dir).values()
        run = m["run_id"]
        own = sorted(p.relative_to(shard_dir) for p in shard_dir.rglob("*.bin"))
        assert own == [Path(run, "step-00000006", f"shard-0000{i}-of-00002.bin") for i in range(2)]
        assert [e["shard_path"] for e in m["shards"]] == [str(p) for p in own]
        assert not list(job_dir.glob("step-*/*.bin"))  # not split between the two directories
        before = {p: p.read_bytes() for p in shard_dir.rglob("*.bin")}
        other = tmp_path / "other"
        second = job(
            token,
            a,
            "--max_step",
            "6",
            "--reuse-shard-rows",
            "--checkpoint-dir",
            str(other),
            "--checkpoint-every",
            "6",
        )
        assert second.returncode == 0, second.stderr[-3000:]
        (m2,) = manifests(other).values()
        assert m2["run_id"] != run
        assert all(e["shard_path"].startswith(m2["run_id"] + "/") for e in m2["shards"])
        assert {p: p.read_bytes() for p in before} == before
    # one new shard over the same directory reads both old files (2 -> 1) and the run ends
    # with the bits of one never interrupted
    with standalone_shards(token, DIM, 1, extra=["--checkpoint-dir", str(shard_dir)]) as (b, _):
        out = tmp_path / "resumed.npz"
        resumed = job(
            token,
            b,
            "--max_step",
            "10",
            "--resume",
            "--checkpoint-dir",
            str(job_dir),
            "--dump-state",
            str(out),
        )
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_dumps_equal(load_dump(out), want, "external shards, resumed")
    # the offline exporter finds the shards' files under --shard-dir, and says so without it
    step_dir = job_dir / "step-00000006"
    refused = run_module("cpu_dist.export", str(step_dir), "--output", str(tmp_path / "no"))
    assert refused.returncode == 2 and "--shard-dir" in refused.stderr, refused.stderr[-3000:]
    assert not (tmp_path / "no").exists()
    bundle = tmp_path / "bundle"
    args = [str(step_dir), "--output", str(bundle), "--shard-dir", str(tmp_path / "empty-dir")]
    exported = run_module("cpu_dist.export", *args, "--shard-dir", str(shard_dir))
    assert exported.returncode == 0, exported.stderr[-3000:]
    b = open_bundle(bundle)
    assert b.steps == 6 and len(b.keys) == sum(e["rows"] for e in m["shards"]) > 0


def test_a_resume_whose_files_a_shard_cannot_read_is_refused_naming_them(token, tmp_path):
    job_dir, shard_dir, elsewhere = tmp_path / "ck", tmp_path / "shards", tmp_path / "empty"
    shard_dir.mkdir()
    elsewhere.mkdir()
    flags = ["--checkpoint-dir", str(job_dir), "--checkpoint-every", "2"]
    with standalone_shards(token, DIM, 1, extra=["--checkpoint-dir", str(shard_dir)]) as (a, _):
        assert job(token, a, "--max_step", "2", *flags).returncode == 0
    (m,) = manifests(job_dir).values()
    with standalone_shards(token, DIM, 1, extra=["--checkpoint-dir", str(elsewhere)]) as (b, _):
        proc = job(token, b, "--max_step", "4", "--resume", *flags)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("launcher.py: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert f"shard 0 ({b[0]})" in lines[0] and m["shards"][0]["shard_path"] in lines[0], lines
    assert "step 2" not in proc.stdout  # nothing trained
