"""The Python side of checkpoints: manifest, choice of the newest complete checkpoint, file
checks, pruning, and worker 0's dense state (parameters, AdamW state, RNG) bit for bit."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from cpu_dist.checkpoint.dense_state import load_dense, save_dense
from cpu_dist.checkpoint.manifest import (
    CheckpointError,
    FileEntry,
    Manifest,
    check_files,
    check_matches,
    find_latest,
    prune,
    read_manifest,
    step_dir_name,
)


def make(root, step: int, write_manifest: bool = True, run_id: str = "r1") -> Manifest:
    d = root / step_dir_name(step)
    d.mkdir(parents=True)
    (d / "shard-00000-of-00001.bin").write_bytes(b"x" * 10)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    dense = save_dense(d / "dense.pt", model, opt.state_dict(), step)
    m = Manifest(
        step=step,
        table="embedding",
        dim=8,
        num_shards=1,
        shards=[FileEntry("shard-00000-of-00001.bin", 10, 123, 1)],
        dense=dense,
        config={"model.embedding_dim": 8, "train.dense_optimizer": "adamw"},
        run_id=run_id,
    )
    if write_manifest:
        m.write(d)
    m.path = d
    return m


def test_a_run_prunes_only_its_own_checkpoints(tmp_path):
    for step, run in [(1, "a"), (2, "b"), (3, "a"), (4, "a"), (5, "b")]:
        make(tmp_path, step, run_id=run)
    assert read_manifest(tmp_path / "step-00000004").run_id == "a"
    removed = prune(tmp_path, 1, "a")
    assert sorted(p.name for p in removed) == ["step-00000001", "step-00000003"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000002",
        "step-00000004",
        "step-00000005",
    ]


def test_newest_complete_checkpoint_is_chosen(tmp_path):
    assert find_latest(tmp_path / "none") is None
    make(tmp_path, 4)
    make(tmp_path, 9)
    make(tmp_path, 14, write_manifest=False)  # unfinished: ignored
    m = find_latest(tmp_path)
    assert m.step == 9 and m.path.name == "step-00000009"
    check_files(m)
    check_matches(
        m,
        dim=8,
        table="embedding",
        config={"model.embedding_dim": 8, "train.dense_optimizer": "adamw"},
        must_match=("model.embedding_dim", "train.dense_optimizer"),
    )
    assert prune(tmp_path, 1) == [tmp_path / "step-00000004"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000009", "step-00000014"]
    make(tmp_path, 19)
    prune(tmp_path, 1)  # the unfinished 14 is older than the newest complete: removed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000019"]


def test_every_problem_names_the_file(tmp_path):
    m = make(tmp_path, 3)
    mf = m.path / "manifest.json"
    with pytest.raises(
        CheckpointError, match="--dense-optimizer 'adamw' in the checkpoint, 'sgd' in this job"
    ):
        check_matches(
            m,
            dim=8,
            table="embedding",
            config={"train.dense_optimizer": "sgd"},
            must_match=("train.dense_optimizer",),
        )
    with pytest.raises(CheckpointError, match=f"{mf}: embedding dim 8, this job has dim 4"):
        check_matches(m, dim=4, table="embedding", config={}, must_match=())
    with pytest.raises(CheckpointError, match=f"{mf}: table 'embedding', this job trains 't'"):
        check_matches(m, dim=8, table="t", config={}, must_match=())
    shard = m.path / "shard-00000-of-00001.bin"
    shard.write_bytes(b"x" * 9)
    with pytest.raises(
        CheckpointError, match=f"{shard}: truncated \\(9 bytes, the manifest says 10\\)"
    ):
        check_files(m)
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"{shard}: missing"):
        check_files(m)
    shard.write_bytes(b"x" * 10)
    dense = m.path / "dense.pt"
    raw = bytearray(dense.read_bytes())
    raw[len(raw) // 2] ^= 1
    dense.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=f"{dense}: corrupt \\(crc32"):
        check_files(m)
    good = mf.read_text()
    for text, msg in [
        ("{oops", "corrupt manifest"),
        (
            good.replace('"format_version": 3', '"format_version": 4'),
            "format version 4, this build reads versions 1, 2, 3",
        ),
        (json.dumps({**json.loads(good), "num_shards": 2}), "1 shard files for num_shards 2"),
        (good.replace("shard-00000-of-00001.bin", "../../etc/passwd"), "file name"),
    ]:
        mf.write_text(text)
        with pytest.raises(CheckpointError, match=msg) as ei:
            read_manifest(m.path)
        assert str(mf) in str(ei.value)
        with pytest.raises(CheckpointError):
            find_latest(tmp_path)  # a damaged manifest is an error, not a reason to go back


def test_dense_state_round_trip_is_bit_exact(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x = torch.randn(16, 4)
    for _ in range(3):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    np.random.seed(5)
    random.seed(6)
    save_dense(tmp_path / "d.pt", model, opt.state_dict(), 2)
    want_next = (torch.rand(3), np.random.rand(3), random.random())

    def step_all(m, o):
        o.zero_grad()
        m(x).pow(2).mean().backward()
        o.step()
        return [p.detach().clone() for p in m.parameters()]

    want = step_all(model, opt)

    torch.manual_seed(99)
    other = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.01)
    other_opt.load_state_dict(load_dense(tmp_path / "d.pt", other, 2))
    got_next = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(want_next[0], got_next[0])
    np.testing.assert_array_equal(want_next[1], got_next[1])
    assert want_next[2] == got_next[2]
    for a, b in zip(step_all(other, other_opt), want):
        assert torch.equal(a, b)  # same parameters after one more AdamW step: state restored
    with pytest.raises(CheckpointError, match="holds step 2, the manifest says 5"):
        load_dense(tmp_path / "d.pt", other, 5)
    wrong = torch.nn.Linear(4, 2)
    with pytest.raises(CheckpointError, match="dense parameters do not match"):
        load_dense(tmp_path / "d.pt", wrong, 2)


def _table(name: str, dim: int, **kw) -> dict:
    t = {
        "name": name,
        "dim": dim,
        "optimizer": "sgd",
        "init_scale": 0.1,
        "seed": 5,
        "num_embeddings": 0,
        "admit_after": 0,
        "expire_after": 0,
        "eps": 0.0,
        "features": [f"f_{name}"],
    }
    t.update(kw)
    return t


def test_the_manifest_records_the_tables_and_resume_refuses_others(tmp_path):
    m = make(tmp_path, 3, write_manifest=False)
    m.tables = [_table("item", 32, optimizer="adagrad", eps=1e-8), _table("user", 4)]
    m.write(m.path)
    back = read_manifest(m.path)
    assert back.format_version == 3 and back.tables == m.tables
    ok = dict(dim=8, table="embedding", config={}, must_match=())
    check_matches(back, tables=[dict(t) for t in m.tables], **ok)
    other_lr_only = [dict(t) for t in m.tables]  # lr is not in the spec: no refusal
    check_matches(back, tables=other_lr_only, **ok)
    cases = [
        ([_table("item", 32, optimizer="adagrad", eps=1e-8), _table("user", 8)], "'user': dim 4"),
        (
            [_table("item", 32, optimizer="rowwise_adagrad"), _table("user", 4)],
            "'item': optimizer 'adagrad' in the checkpoint, 'rowwise_adagrad' in this job",
        ),
        (
            [_table("item", 32, optimizer="adagrad", eps=1e-8), _table("user", 4, seed=6)],
            "'user': seed 5",
        ),
        (
            [_table("item", 32, optimizer="adagrad", eps=1e-8), _table("user", 4, features=["x"])],
            "'user': features ['f_user'] in the checkpoint, ['x'] in this job",
        ),
        ([_table("item", 32, optimizer="adagrad", eps=1e-8)], "holds table 'user', which this"),
        (
            [*m.tables, _table("ads", 16)],
            "has no table 'ads' (it holds item, user)",
        ),
    ]
    for job, fragment in cases:
        with pytest.raises(CheckpointError, match=r"manifest\.json: ") as ei:
            check_matches(back, tables=job, **ok)
        assert fragment in str(ei.value), str(ei.value)


def test_a_version_2_manifest_is_the_one_default_table(tmp_path):
    m = make(tmp_path, 4, write_manifest=False)
    raw = json.loads(m.to_json())
    raw["format_version"] = 2
    del raw["tables"]
    (m.path / "manifest.json").write_text(json.dumps(raw))
    back = read_manifest(m.path)
    assert back.format_version == 2 and back.tables == []
    ok = dict(dim=8, table="embedding", config={}, must_match=())
    check_matches(back, tables=[_table("embedding", 8)], **ok)
    with pytest.raises(CheckpointError, match=r"holds the one table 'embedding' \(dim 8; format"):
        check_matches(back, tables=[_table("item", 8), _table("user", 4)], **ok)
    with pytest.raises(CheckpointError, match="this job has 'embedding' \\(dim 16\\)"):
        check_matches(back, tables=[_table("embedding", 16)], **ok)


def test_a_resume_with_another_model_or_other_model_arguments_is_refused(tmp_path):
    """The job's MUST_MATCH holds the model and its arguments: a checkpoint of a dcnv2 job
    refuses a dlrm resume, and one of other [model] arguments, naming the setting."""
    from cpu_dist.checkpoint.coordinator import MUST_MATCH
    from cpu_dist.common.flags import parse_args
    from cpu_dist.common.validate import validate

    features = ", ".join(f'"cat_{i}"' for i in range(26))

    def settings(*argv: str, toml: str = "") -> dict:
        job = tmp_path / f"job{len(toml)}.toml"
        job.write_text(f'{toml}[[tables]]\nname = "t"\nfeatures = [{features}]\n')
        return validate(parse_args(["--config", str(job), *argv]), 3).settings()

    m = make(tmp_path, 3)
    m.config = settings("--model", "dcnv2", toml="[model]\nlow_rank_dim = 8\n")
    ok = dict(dim=8, table="embedding", must_match=MUST_MATCH)
    check_matches(m, config=m.config, **ok)
    with pytest.raises(CheckpointError, match=r"--model 'dcnv2' in the checkpoint, 'dlrm'"):
        check_matches(m, config=settings(toml="[model]\nlow_rank_dim = 8\n"), **ok)
    with pytest.raises(CheckpointError, match=r"low_rank_dim.*8.*16"):
        check_matches(
            m, config=settings("--model", "dcnv2", toml="[model]\nlow_rank_dim = 16\n"), **ok
        )


def test_a_resume_with_another_synthetic_dense_width_or_cardinalities_is_refused(tmp_path):
    """``data.num_dense`` and ``data.cardinalities`` are MUST_MATCH settings (they make the
    synthetic stream the model was trained on); a checkpoint written before they were
    recorded was trained with their defaults (13, none), so it resumes a default job and
    refuses ``[data] dense = 5``."""
    from cpu_dist.checkpoint.coordinator import checkpoint_to_resume
    from cpu_dist.common.flags import parse_args
    from cpu_dist.common.validate import validate

    ckpt = tmp_path / "ckpt"
    make(ckpt, 3)  # its settings lack both keys: an older checkpoint

    def resume(toml: str):
        job = tmp_path / "job.toml"
        job.write_text(f'[data]\nkind = "synthetic"\n{toml}')
        argv = ["--config", str(job), "--embedding-dim", "8", "--dense-optimizer", "adamw",
                "--checkpoint-dir", str(ckpt)]  # fmt: skip
        return checkpoint_to_resume(validate(parse_args([*argv, "--resume"]), 3))

    assert resume("").step == 3
    with pytest.raises(CheckpointError, match=r"\[data\] dense 13 in the checkpoint, 5 in this"):
        resume("dense = 5\n")
    m = read_manifest(ckpt / step_dir_name(3))
    m.config = {**m.config, "data.num_dense": 5, "data.cardinalities": [["tags", 300]]}
    m.write(ckpt / step_dir_name(3))
    with pytest.raises(CheckpointError, match=r"cardinalities \[\['tags', 300\]\] in the chec"):
        resume("dense = 5\n")  # the job: no cardinalities
