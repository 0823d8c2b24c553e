"""The owner record of a checkpoint directory, ``DIR/OWNER.json``: the one run that writes there.

Why a record and not a lock: the shared file systems Slurm clusters use (NFS, Lustre, BeeGFS)
have no OS locks, locks per node, or locks that outlive a dead node.  The record is created
exclusively (``O_EXCL``), so of two runs started together one holds the directory and the other
is refused.  It names the run, host, pid, Slurm job and restart count, and carries a heartbeat
that worker 0 renews at each checkpoint and at least every ``RENEW_S`` while it works: a write
of a temporary file and ``os.replace`` from the training thread (no thread that could hang).

A record is live while its pid lives (on this host; a reused pid is told apart by the
process's start time where ``/proc`` has it) or, seen from another host, while its heartbeat is
younger than ``LEASE_S`` (the hosts' clocks are taken to agree within seconds).  A record that
is not live is stale and taken over.  A ``--resume`` of the same run (the checkpoint's run id)
or of the same Slurm job (a requeue keeps ``SLURM_JOB_ID``) takes it over from another host
even within the lease, so a crash never blocks a resume; only a live process on this host keeps
it.  A job releases its record (only while it is still its own) at every exit it controls;
before each checkpoint and prune worker 0 re-reads it and stops with ``OwnerError`` (exit 2)
when another run holds the directory now.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from cpu_dist.common.files import atomic_write, fsync_dir
from cpu_dist.common.procfs import proc_stat
from cpu_dist.common.slurm import slurm_job

from .manifest import CheckpointError

OWNER = "OWNER.json"
FORMAT = "cpu_dist-checkpoint-owner"
LEASE_S = 60.0  # a record from another host is live while its heartbeat is younger than this
RENEW_S = 20.0  # worker 0 renews at least this often, well within the lease
_TRIES = 5  # claims in a row lost to other runs before giving up (each is a fresh look)


class OwnerError(CheckpointError):
    """The checkpoint directory is held by another run, or this run no longer holds it."""


@dataclass(frozen=True)
class OwnerRecord:
    run_id: str
    host: str
    pid: int
    slurm_job_id: str = ""
    slurm_restart_count: str = ""
    since: float = 0.0  # when this run took the directory (Unix time)
    heartbeat: float = 0.0  # its last renewal (Unix time)
    pid_start: str = ""  # /proc/PID/stat's start time: a reused pid is not the owner
    claim: str = ""  # this claim's own token: a resumed attempt of the same run is another
    format: str = FORMAT

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True) + "\n").encode()

    def describe(self) -> str:
        """``run R (host H, pid P, Slurm job J) since T``, as a refusal names the holder."""
        if self.claim == "?":
            return f"a run whose {OWNER} is unreadable (written {_when(self.heartbeat)})"
        slurm = f", Slurm job {self.slurm_job_id}" if self.slurm_job_id else ""
        who = f"run {self.run_id} (host {self.host}, pid {self.pid}{slurm})"
        return f"{who} since {_when(self.since)}"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _parse(raw: bytes, mtime: float) -> OwnerRecord:
    """The record in ``raw``; one that cannot be read (its creator is writing it right now, or
    it is damaged) is judged by its file's age alone: its host is no host."""
    try:
        d = json.loads(raw)
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError("not an owner record")
        return OwnerRecord(
            run_id=str(d["run_id"]),
            host=str(d["host"]),
            pid=int(d["pid"]),
            slurm_job_id=str(d.get("slurm_job_id", "")),
            slurm_restart_count=str(d.get("slurm_restart_count", "")),
            since=float(d["since"]),
            heartbeat=float(d["heartbeat"]),
            pid_start=str(d.get("pid_start", "")),
            claim=str(d.get("claim", "")),
        )
    except (ValueError, KeyError, TypeError):
        return OwnerRecord(run_id="?", host="", pid=0, since=mtime, heartbeat=mtime, claim="?")


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3... of /proc/PID/stat (state first, start time at index 19); None without."""
    found = proc_stat(pid)
    return found[1] if found is not None and len(found[1]) > 19 else None


def pid_start(pid: int) -> str:
    """When process ``pid`` started (clock ticks after boot, field 22 of /proc/PID/stat); ""
    where unknown."""
    fields = _proc_stat(pid)
    return fields[19] if fields else ""


def pid_alive(pid: int, start: str = "") -> bool:
    """Whether process ``pid`` of this host runs, and is the one that started at ``start``.
    A zombie has ended: a killed job's ranks stay zombies where nothing reaps them (a
    container whose init does not), and ``kill(pid, 0)`` still finds them."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    fields = _proc_stat(pid)
    if fields is None:
        return True  # no /proc: the signal's word
    if fields[0] in ("Z", "X"):
        return False
    return not start or fields[19] == start


def is_live(rec: OwnerRecord, host: str, now: float) -> bool:
    if rec.host == host:
        return pid_alive(rec.pid, rec.pid_start)
    return now - rec.heartbeat < LEASE_S


def record_for(
    run_id: str, environ: Mapping[str, str] | None = None, now: float | None = None
) -> OwnerRecord:
    """This process's record as the holder of a directory for run ``run_id``."""
    job, restarts = slurm_job(environ)
    t = time.time() if now is None else now
    pid = os.getpid()
    return OwnerRecord(
        run_id=run_id,
        host=socket.gethostname(),
        pid=pid,
        slurm_job_id=job,
        slurm_restart_count=restarts,
        since=t,
        heartbeat=t,
        pid_start=pid_start(pid),
        claim=secrets.token_hex(8),
    )


def read_owner(root: Path) -> tuple[OwnerRecord, bytes] | None:
    """The record of ``root`` and its bytes; None when there is none."""
    try:
        with open(root / OWNER, "rb") as f:
            raw = f.read()
            mtime = os.fstat(f.fileno()).st_mtime
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OwnerError(f"{root / OWNER}: cannot read it ({exc.strerror})") from None
    return _parse(raw, mtime), raw


def takes_over(held: OwnerRecord, mine: OwnerRecord, resume: bool, now: float) -> bool:
    """Whether ``mine`` may replace ``held``: a stale record, or from another host one of the
    run or Slurm job this ``--resume`` continues."""
    if not is_live(held, mine.host, now):
        return True
    same = held.run_id == mine.run_id or (
        held.slurm_job_id != "" and held.slurm_job_id == mine.slurm_job_id
    )
    return resume and same and held.host != mine.host


def _create(path: Path, data: bytes) -> bool:
    """Creates ``path`` holding ``data`` unless it exists (False)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return False
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    return True


def _set_aside(root: Path, judged: bytes) -> None:
    """Removes the stale record judged from ``judged`` (a rename, so that of two runs taking it
    over only one removes it); a record that changed since (renewed, or another run's claim)
    is put back where no record is."""
    aside = root / f".{OWNER}.stale-{secrets.token_hex(4)}"
    try:
        os.rename(root / OWNER, aside)
    except FileNotFoundError:
        return
    try:
        if aside.read_bytes() != judged:
            try:
                os.link(aside, root / OWNER)
            except OSError:
                pass  # a record is there again, or no hard links: the newer record stays lost
    finally:
        aside.unlink(missing_ok=True)


def claim(
    root: Path,
    run_id: str,
    *,
    resume: bool,
    flag_dir: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Owner:
    """Takes ``root`` for run ``run_id`` (creating the directory); raises OwnerError naming
    the holder when another run holds it.  ``flag_dir``: the directory as the user gave it."""
    flag = f"--checkpoint-dir {flag_dir if flag_dir is not None else root}"
    mine = record_for(run_id, environ)
    try:
        root.mkdir(parents=True, exist_ok=True)
        for _ in range(_TRIES):
            if _create(root / OWNER, mine.to_bytes()):
                fsync_dir(root)
                return Owner(root, mine, flag)
            found = read_owner(root)
            if found is None:
                continue  # released meanwhile
            held, raw = found
            if not takes_over(held, mine, resume, time.time()):
                raise OwnerError(
                    f"{flag} is held by {held.describe()}; another job writes its checkpoints "
                    f"there (a record whose process is gone is taken over: from this host at "
                    f"once, from another host {LEASE_S:.0f} s after its last heartbeat)"
                )
            _set_aside(root, raw)
    except OSError as exc:
        raise OwnerError(f"{flag}: cannot take {root / OWNER} ({exc.strerror or exc})") from None
    raise OwnerError(f"{flag}: other runs took {OWNER} {_TRIES} times in a row; try again")


class Owner:
    """This run's hold on its checkpoint directory (worker 0's)."""

    def __init__(self, root: Path, record: OwnerRecord, flag: str) -> None:
        self.root, self.record, self.flag = root, record, flag
        self._renewed = time.monotonic()
        self._lock = threading.Lock()  # renew() from kept_alive's thread and the caller's

    @property
    def run_id(self) -> str:
        return self.record.run_id

    def check(self, what: str) -> None:
        """Raises OwnerError unless the record is still this run's; ``what`` is what is then
        not written."""
        found = read_owner(self.root)
        if found is None:
            raise OwnerError(
                f"{self.flag}: its {OWNER} was removed, so run {self.run_id} no longer holds "
                f"the directory; {what} not written"
            )
        held = found[0]
        if held.claim != self.record.claim:
            raise OwnerError(
                f"{self.flag} is now held by {held.describe()}, not by this run "
                f"({self.run_id}); {what} not written"
            )

    def renew(self, what: str = "the heartbeat") -> None:
        """A new heartbeat, once the record is found to be still this run's."""
        with self._lock:
            self.check(what)
            record = replace(self.record, heartbeat=time.time())
            atomic_write(self.root / OWNER, lambda f: f.write(record.to_bytes()))
            self.record, self._renewed = record, time.monotonic()

    @contextmanager
    def kept_alive(self, what: str) -> Iterator[None]:
        """The heartbeat renewed every ``RENEW_S`` on a thread of its own while ``what`` (a
        shard save, a dump, an export: one call that may outlast the lease) keeps worker 0
        from its loop, so that a run on another host never takes the directory of a holder
        that is only busy.  A record found no longer this run's stops the renewals and is
        raised once ``what`` ends (OwnerError); a failed write is tried again at the next
        beat.  The thread is a daemon and is joined on the way out."""
        stop = threading.Event()
        lost: list[OwnerError] = []

        def beat() -> None:
            while not stop.wait(RENEW_S):
                try:
                    self.renew(what)
                except OwnerError as exc:
                    lost.append(exc)
                    return
                except OSError:
                    continue

        thread = threading.Thread(target=beat, name="owner-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=RENEW_S)
        if lost:
            raise lost[0]

    def renew_if_due(self) -> None:
        """A renewal when RENEW_S have passed; a write that fails (a full or stale file
        system) is tried again at the next call, well within the lease: only a record that is
        no longer this run's (OwnerError) stops the run."""
        if time.monotonic() - self._renewed >= RENEW_S:
            try:
                self.renew()
            except OwnerError:
                raise
            except OSError:
                pass

    def release(self) -> None:
        """Removes the record if it is still this run's.  Never raises: it runs on the way
        out, after whatever ended the job."""
        try:
            found = read_owner(self.root)
            if found is not None and found[0].claim == self.record.claim:
                (self.root / OWNER).unlink()
                fsync_dir(self.root)
        except (OSError, CheckpointError):
            pass
