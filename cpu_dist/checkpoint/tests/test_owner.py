"""The owner record of a checkpoint directory (``owner.py``): created exclusively, refused while
live (this process's own pid stands for a live run on this host; a heartbeat for another
host), taken over when stale or by a resume of the same run or Slurm job, and checked before
every write."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from dataclasses import replace

import pytest

from cpu_dist.checkpoint import owner as owner_module
from cpu_dist.checkpoint.owner import (
    LEASE_S,
    OWNER,
    OwnerError,
    OwnerRecord,
    claim,
    read_owner,
    record_for,
)

HOST = socket.gethostname()


def forge(root, **fields) -> OwnerRecord:
    """Another run's record in ``root``: this host and this test's own (live) pid unless
    ``fields`` say otherwise."""
    rec = replace(record_for("theirs", environ={"SLURM_JOB_ID": "77"}), **fields)
    root.mkdir(parents=True, exist_ok=True)
    (root / OWNER).write_bytes(rec.to_bytes())
    return rec


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def holder(root) -> OwnerRecord:
    found = read_owner(root)
    assert found is not None
    return found[0]


def test_a_fresh_directory_is_claimed_with_who_holds_it_and_released(tmp_path, monkeypatch):
    d = tmp_path / "ck"
    env = {"SLURM_JOB_ID": "123", "SLURM_RESTART_COUNT": "2"}
    t0 = time.time()
    owner = claim(d, "r1", resume=False, environ=env)
    raw = json.loads((d / OWNER).read_text())
    assert (raw["run_id"], raw["host"], raw["pid"]) == ("r1", HOST, os.getpid())
    assert (raw["slurm_job_id"], raw["slurm_restart_count"]) == ("123", "2")
    assert t0 <= raw["heartbeat"] == raw["since"] <= time.time()
    later = raw["heartbeat"] + 30
    monkeypatch.setattr(time, "time", lambda: later)
    owner.renew()
    renewed = holder(d)
    assert renewed.heartbeat == later and renewed.claim == owner.record.claim
    monkeypatch.undo()
    owner.release()
    assert not (d / OWNER).exists()
    owner.release()  # twice: nothing to do, no error


def test_a_live_holder_refuses_another_run_in_one_line(tmp_path):
    d = tmp_path / "ck"
    theirs = forge(d)  # this process: alive on this host
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(theirs.since))
    for resume in (False, True):
        with pytest.raises(OwnerError) as ei:
            claim(d, "mine", resume=resume, flag_dir="ck")
        msg = str(ei.value)
        assert msg.startswith(
            f"--checkpoint-dir ck is held by run theirs (host {HOST}, pid {os.getpid()}, "
            f"Slurm job 77) since {since}"
        ), msg
        assert "\n" not in msg
    # even a resume of the same run (or Slurm job): its process is alive here
    with pytest.raises(OwnerError):
        claim(d, "theirs", resume=True, environ={"SLURM_JOB_ID": "77"})
    assert holder(d) == theirs  # untouched


def test_another_hosts_record_is_live_for_the_lease(tmp_path):
    d = tmp_path / "ck"
    theirs = forge(d, host="elsewhere", pid=1, heartbeat=time.time() - LEASE_S / 2)
    with pytest.raises(OwnerError, match="held by run theirs \\(host elsewhere, pid 1, Slurm"):
        claim(d, "mine", resume=False)
    assert holder(d) == theirs
    forge(d, host="elsewhere", pid=1, heartbeat=time.time() - LEASE_S - 5)
    owner = claim(d, "mine", resume=False)  # its heartbeat is older than the lease: stale
    assert holder(d).run_id == "mine" and holder(d).claim == owner.record.claim


def test_a_dead_pid_or_a_reused_one_on_this_host_is_taken_over(tmp_path):
    d = tmp_path / "ck"
    forge(d, pid=dead_pid())
    assert holder(d).run_id == "theirs"
    claim(d, "mine", resume=False)
    assert holder(d).run_id == "mine"
    # a live pid that is not the process that wrote the record (another start time)
    forge(d, pid=os.getpid(), pid_start="1")
    claim(d, "third", resume=False)
    assert holder(d).run_id == "third"
    # a process that has exited but is not reaped (a killed job's rank where nothing reaps)
    proc = subprocess.Popen(["true"])
    try:
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # ended, still a zombie
        forge(d, pid=proc.pid, pid_start="")
        claim(d, "fourth", resume=False)
        assert holder(d).run_id == "fourth"
    finally:
        proc.wait()


def test_an_unreadable_record_is_judged_by_its_age(tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    (d / OWNER).write_bytes(b"")  # its creator between create and write
    with pytest.raises(OwnerError, match=r"held by a run whose OWNER\.json is unreadable"):
        claim(d, "mine", resume=False)
    old = time.time() - LEASE_S - 5
    os.utime(d / OWNER, (old, old))
    claim(d, "mine", resume=False)
    assert holder(d).run_id == "mine"


def test_a_resume_of_the_same_run_or_slurm_job_takes_it_over_from_another_host(tmp_path):
    d = tmp_path / "ck"
    young = time.time()
    forge(d, host="elsewhere", pid=1, heartbeat=young)  # a crashed node, within the lease
    with pytest.raises(OwnerError):
        claim(d, "theirs", resume=False)  # only a resume continues a run
    claim(d, "theirs", resume=True)
    assert holder(d).host == HOST
    forge(d, host="elsewhere", pid=1, heartbeat=young)
    requeue = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"}
    claim(d, "another id", resume=True, environ=requeue)  # the same Slurm job, requeued
    assert (holder(d).slurm_job_id, holder(d).slurm_restart_count) == ("77", "1")
    forge(d, host="elsewhere", pid=1, heartbeat=young)
    with pytest.raises(OwnerError):
        claim(d, "another id", resume=True, environ={"SLURM_JOB_ID": "78"})


def test_a_run_that_lost_the_directory_stops_and_leaves_the_new_record(tmp_path):
    d = tmp_path / "ck"
    owner = claim(d, "mine", resume=False)
    owner.check("checkpoint step-00000001")  # still ours
    theirs = forge(d, run_id="newer", host="elsewhere", pid=9)
    with pytest.raises(OwnerError) as ei:
        owner.check("checkpoint step-00000002")
    assert "is now held by run newer (host elsewhere, pid 9, Slurm job 77)" in str(ei.value)
    assert str(ei.value).endswith("checkpoint step-00000002 not written")
    with pytest.raises(OwnerError):
        owner.renew()  # never overwrites another run's record
    owner.release()
    assert holder(d) == theirs
    (d / OWNER).unlink()
    with pytest.raises(OwnerError, match=r"OWNER\.json was removed"):
        owner.check("pruning")


def _heartbeat_threads() -> int:
    return sum(t.name == "owner-heartbeat" for t in threading.enumerate())


def test_a_long_operation_keeps_the_heartbeat_and_hears_of_a_lost_record(tmp_path, monkeypatch):
    """A shard save, dump or export that outlasts the lease: its heartbeat is renewed on a
    thread of its own meanwhile (before, a run on another host could take the directory of a
    holder that was only busy), and a record another run took is raised when it ends."""
    monkeypatch.setattr(owner_module, "RENEW_S", 0.02)
    d = tmp_path / "ck"
    owner = claim(d, "r1", resume=False, environ={})
    first = holder(d).heartbeat
    with owner.kept_alive("a long save"):
        deadline = time.monotonic() + 20
        while holder(d).heartbeat == first:  # renewed while the operation runs
            assert time.monotonic() < deadline, "the heartbeat was not renewed"
            time.sleep(0.01)
    assert _heartbeat_threads() == 0  # joined on the way out
    with pytest.raises(OwnerError, match=r"now held by run theirs .*a long export not written"):
        with owner.kept_alive("a long export"):
            forge(d, host="elsewhere")  # another run took it meanwhile
            deadline = time.monotonic() + 20
            while _heartbeat_threads():  # the thread stops at its next beat
                assert time.monotonic() < deadline, "the lost record went unnoticed"
                time.sleep(0.01)
    assert holder(d).run_id == "theirs"  # left as the other run wrote it
