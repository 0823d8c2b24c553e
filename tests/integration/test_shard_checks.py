"""A job checks the external shards it is given before it trains: each must be the shard its
position in --ps_list says, with the job's dim, seed and init scale, and must not hold another
job's rows (unless the job restores a checkpoint over them or says --reuse-shard-rows).  A job
with --resume takes over shards a crashed job left sessions on.  Real shard processes, real
mpirun jobs."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_dist.checkpoint.manifest import find_latest, steps_done
from cpu_dist.testing.shards import standalone_shards

from .jobctl import Job
from .launch import SMALL, external_job, mpirun

pytestmark = pytest.mark.timeout(600)
DIM = 8  # SMALL's embedding dim


def job(token: str, addresses: list[str], *extra: str, workers: int = 1):
    return external_job(token, addresses, *extra, workers=workers)


def test_a_ps_list_out_of_order_stops_the_job_naming_the_shard(token):
    with standalone_shards(token, DIM, 2) as (addrs, _):
        proc = job(token, [addrs[1], addrs[0]])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"shard 0 of --ps_list ({addrs[1]}) does not match the job" in proc.stderr
    assert "shard_index 1 (the job expects 0)" in proc.stderr


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--init-scale", "0.01"], "init_scale 0.009999"),
        (["--seed", "3"], "seed 3 (the job expects 0)"),
    ],
)
def test_a_shard_with_other_settings_stops_the_job(token, flags, needle):
    with standalone_shards(token, DIM, 1, extra=flags) as (addrs, _):
        proc = job(token, addrs)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert needle in proc.stderr and addrs[0] in proc.stderr


def test_the_server_defaults_to_the_jobs_init_scale(token, tmp_path):
    with standalone_shards(token, DIM, 1) as (addrs, _):
        proc = job(token, addrs, "--dump-state", str(tmp_path / "m.npz"))
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_rows_of_another_job_are_never_trained_on_silently(token, tmp_path):
    ckpt = tmp_path / "ckpt"
    with standalone_shards(token, DIM, 1) as (addrs, _):
        assert job(token, addrs).returncode == 0  # leaves its rows behind
        again = job(token, addrs)
        assert again.returncode == 2 and "already hold rows" in again.stderr, again.stderr[-2000:]
        assert "--reuse-shard-rows" in again.stderr
        nothing = job(token, addrs, "--checkpoint-dir", str(ckpt), "--resume")
        assert nothing.returncode == 2 and "already hold rows" in nothing.stderr
        reuse = job(token, addrs, "--reuse-shard-rows")
        assert reuse.returncode == 0, reuse.stderr[-2000:]


def test_resume_takes_over_shards_a_killed_job_left_sessions_on(token, tmp_path):
    ckpt, m = tmp_path / "ckpt", tmp_path / "m.jsonl"
    ckpt.mkdir()
    # the shard writes its part of every checkpoint itself, under its own --checkpoint-dir
    with standalone_shards(token, DIM, 1, extra=["--checkpoint-dir", str(ckpt)]) as (addrs, _):
        args = [
            "--worker-num",
            "2",
            "--ps_list",
            addrs[0],
            "--token-file",
            token,
            *SMALL,
            "--checkpoint-dir",
            str(ckpt),
            "--checkpoint-every",
            "2",
            "--max_step",
            "100000",
        ]
        crashed = Job(2, args, m)
        try:
            crashed.wait_for_steps(5, timeout=180)  # at least two checkpoints written
            crashed.kill_rank(1)
            crashed.finish(timeout=120)
        finally:
            crashed.kill_all()
        out = tmp_path / "resumed.npz"
        latest = find_latest(ckpt)  # however far the killed job got: a few steps beyond it
        assert latest is not None
        end = str(steps_done(latest.step) + 4)
        resumed = mpirun(2, [*args[:-2], "--max_step", end, "--resume", "--dump-state", str(out)])
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert "resumed from" in resumed.stderr
    with np.load(out) as z:
        assert len(z["table/embedding/keys"]) > 0  # the default job's one table


def tables_file(tmp_path, **table) -> str:
    """A job file with one table serving every feature (``table``: its keys)."""
    features = ", ".join(f'"cat_{i}"' for i in range(26))
    keys = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in table.items())
    path = tmp_path / f"job-{len(list(tmp_path.glob('job-*')))}.toml"
    path.write_text(f"[[tables]]\n{keys}features = [{features}]\n")
    return str(path)


def test_a_job_table_named_as_the_shard_s_own_with_another_spec_is_refused(token, tmp_path):
    # the shard's flags declare the table "embedding" of dim 8; the job's "embedding" is 16 wide
    config = tables_file(tmp_path, name="embedding", dim=16)
    with standalone_shards(token, DIM, 1) as (addrs, _):
        proc = job(token, addrs, "--config", config, "--arch-mlp-bot", "16-16")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"shard 0 of --ps_list ({addrs[0]}) refused the tables of --config" in proc.stderr
    assert "table 'embedding' exists on this shard with another dim" in proc.stderr, proc.stderr[
        -2000:
    ]


def test_shards_keep_an_identical_table_and_refuse_another_spec_naming_table_and_field(
    token, tmp_path
):
    from cpu_dist.common.features import CATEGORICAL_FEATURES
    from cpu_dist.common.tables import TableConfig
    from cpu_dist.common.tokens import read_token_file
    from cpu_dist.sparse import Client

    spec = TableConfig("t", DIM, CATEGORICAL_FEATURES).spec(0)  # the job's seed, scale 1/sqrt(8)
    with standalone_shards(token, DIM, 2) as (addrs, _):
        client = Client(addrs, read_token_file(token), DIM)
        try:
            assert [r["created"] for r in client.create_tables([spec])] == [1, 1]
        finally:
            client.close()
        other = job(token, addrs, "--config", tables_file(tmp_path, name="t", init_scale=0.5))
        assert other.returncode == 2, other.stderr[-2000:]
        assert "refused the tables of --config" in other.stderr
        assert "table 't' exists on this shard with another init_scale" in other.stderr, (
            other.stderr[-2000:]
        )
        same = job(token, addrs, "--config", tables_file(tmp_path, name="t"))
        assert same.returncode == 0, same.stderr[-3000:]
        client = Client(addrs, read_token_file(token), DIM)
        try:
            held = [{t["name"]: t for t in h["tables"]} for h in client.health()]
        finally:
            client.close()
    scale = float(np.float32(spec["init_scale"]))  # the shard keeps it as float32
    assert all(h["t"]["dim"] == DIM and h["t"]["init_scale"] == scale for h in held)
