"""A checkpoint's step directory is written under a temporary name and published only if no
``step-N`` is there; worker 0 re-reads its owner record before each save; pruning touches no
other run's folders; a checkpoint after the last step records the outputs still owed.  The
Checkpointer runs in this process (one worker, ``COMM_SELF``) over a fake client whose shards
write their files where they are told, as the C++ shards do."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
import torch
from mpi4py import MPI

from cpu_dist.checkpoint.coordinator import Checkpointer
from cpu_dist.checkpoint.manifest import (
    MANIFEST,
    CheckpointError,
    find_latest,
    prune,
    read_manifest,
    step_dir_name,
    temp_dir_name,
)
from cpu_dist.checkpoint.owner import OWNER, OwnerError, claim, record_for
from cpu_dist.common.flags import parse_args
from cpu_dist.common.mpi_context import STOP
from cpu_dist.common.validate import validate

from .test_manifest import make


class Shards:
    """Writes each shard's file under the job's checkpoint directory, at the path it gets."""

    num_shards = 1

    def __init__(self, root: Path) -> None:
        self.root, self.paths = root, []

    def save(self, paths, step, session, session_step, timeout_s):
        out = []
        for p in paths:
            self.paths.append(p)
            assert not (self.root / p).parent.name.startswith("step-"), p  # never in place
            (self.root / p).write_bytes(b"rows")
            out.append({"bytes": 4, "checksum": zlib.crc32(b"rows"), "rows": 1})
        return out

    def abort_sessions(self):
        pass

    def load(self, paths, sizes, crcs, timeout_s):
        assert all((self.root / p).exists() for p in paths)


class Session:
    id = 1

    def session_step(self, step):
        return step


class Commits:
    session = Session()

    def wait_readable(self, step):
        pass


class Dense:
    def __init__(self, model):
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def optimizer_state(self):
        return self.opt.state_dict()

    def load_optimizer_state(self, state):
        self.opt.load_state_dict(state)


def checkpointer(root: Path, *flags: str, owner=None) -> Checkpointer:
    cfg = validate(
        parse_args(
            [
                "--worker-num",
                "1",
                "--embedding-dim",
                "8",
                "--max_step",
                "4",
                "--checkpoint-dir",
                str(root),
                "--export",
                str(root.parent / "bundle"),
                *flags,
            ]
        ),
        2,
    )
    model = torch.nn.Linear(3, 1)
    return Checkpointer(
        cfg, MPI.COMM_SELF, Shards(root), model, Dense(model), Commits(), owner=owner
    )


def test_a_step_folder_is_written_aside_and_renamed_into_place(tmp_path):
    root = tmp_path / "ck"
    ck = checkpointer(root)
    ck.save(1)
    (shard_path,) = ck.client.paths
    assert shard_path.startswith(".step-00000002.tmp-" + ck.run_id)  # the shards wrote aside
    assert sorted(p.name for p in root.iterdir()) == ["step-00000002"]  # nothing else left
    m = find_latest(root)
    assert m is not None and m.run_id == ck.run_id and m.owed == []
    assert sorted(p.name for p in m.path.iterdir()) == [
        "dense.pt",
        MANIFEST,
        "shard-00000-of-00001.bin",
    ]


def test_a_step_folder_that_exists_is_never_written_into(tmp_path):
    root = tmp_path / "ck"
    theirs = make(root, 1, run_id="theirs")  # step-00000001, another run's
    before = {p.name: p.read_bytes() for p in theirs.path.iterdir()}
    ck = checkpointer(root)
    with pytest.raises(
        CheckpointError, match="step-00000001: already exists \\(a checkpoint of run theirs\\)"
    ):
        ck.save(0)
    assert {p.name: p.read_bytes() for p in theirs.path.iterdir()} == before
    assert sorted(p.name for p in root.iterdir()) == ["step-00000001"]  # its own temp removed
    unfinished = root / step_dir_name(3)
    unfinished.mkdir()
    (unfinished / "x").write_bytes(b"")
    with pytest.raises(CheckpointError, match="an unfinished folder of no known run"):
        ck.save(2)


def test_a_run_that_lost_the_directory_writes_nothing(tmp_path):
    root = tmp_path / "ck"
    owner = claim(root, "mine", resume=False)
    ck = checkpointer(root, owner=owner)
    assert ck.run_id == "mine"  # the run the record names
    ck.save(0)
    other = record_for("theirs")
    (root / OWNER).write_bytes(other.to_bytes())  # another run took the directory over
    with pytest.raises(
        OwnerError, match=r"now held by run theirs .*checkpoint step-00000002 not written"
    ):
        ck.save(1)
    assert sorted(p.name for p in root.iterdir()) == [OWNER, "step-00000001"]


def test_prune_touches_no_other_runs_folders(tmp_path):
    root = tmp_path / "ck"
    for step, run in [(1, "a"), (2, "b"), (3, "a"), (5, "a")]:
        make(root, step, run_id=run)
    (root / step_dir_name(4)).mkdir()  # unfinished, of no known run (an older version's)
    mine = root / temp_dir_name("step-00000004", "a")  # a crashed attempt of run a
    theirs = root / temp_dir_name("step-00000004", "b")  # run b writing right now
    mine.mkdir()
    theirs.mkdir()
    removed = prune(root, 1, "a")
    assert sorted(p.name for p in removed) == sorted(["step-00000001", "step-00000003", mine.name])
    assert sorted(p.name for p in root.iterdir()) == sorted(
        ["step-00000002", "step-00000004", "step-00000005", theirs.name]
    )


def test_keeping_every_checkpoint_still_removes_the_runs_crashed_attempts(tmp_path):
    """--checkpoint-keep 0 keeps every complete checkpoint; a crashed save's temporary folder
    of this run goes all the same (before, it was left on disk for good)."""
    root = tmp_path / "ck"
    for step in (1, 2, 3):
        make(root, step, run_id="a")
    mine = root / temp_dir_name("step-00000004", "a")
    theirs = root / temp_dir_name("step-00000004", "b")
    mine.mkdir()
    theirs.mkdir()
    assert prune(root, 0, "a") == [mine]
    assert sorted(p.name for p in root.iterdir()) == sorted(
        ["step-00000001", "step-00000002", "step-00000003", theirs.name]
    )


def test_a_checkpoint_after_the_last_step_records_what_is_still_owed(tmp_path, monkeypatch):
    root = tmp_path / "ck"
    ck = checkpointer(root, "--test-batches", "0")
    assert ck.outputs == ["final_eval", "export"]
    ck.save(2)  # not the last step: nothing owed
    assert find_latest(root).owed == []
    monkeypatch.setattr(STOP, "signal", 15)  # asked to stop after the last step (of 4)
    assert ck.stop_requested(3)
    assert find_latest(root).owed == ["final_eval", "export"]
    ck.stop_owing(3, ["export"])  # stopped again later: the same checkpoint, less owed
    assert find_latest(root).owed == ["export"]
    assert ck.outputs_done(3)  # asked to stop meanwhile: stopped, nothing owed
    assert find_latest(root).owed == []
    # a requeued run finds what is owed; older manifests, without the field, owe nothing
    ck.stop_owing(3, ["final_eval", "export"])
    again = checkpointer(root, "--test-batches", "0", "--resume")
    assert again.restore() == 4 and again.owed == ["final_eval", "export"]
    monkeypatch.setattr(STOP, "signal", None)
    assert not again.outputs_done(3)
    assert find_latest(root).owed == []
    mf = root / step_dir_name(4) / MANIFEST
    raw = json.loads(mf.read_text())
    raw.pop("owed")
    mf.write_text(json.dumps(raw))
    assert read_manifest(mf.parent).owed == []
    raw["owed"] = ["nonsense"]
    mf.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="corrupt manifest"):
        read_manifest(mf.parent)
