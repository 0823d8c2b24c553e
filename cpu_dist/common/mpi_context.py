"""Who does what in ``MPI_COMM_WORLD``, and the few world-wide exchanges a job needs.

Ranks ``0..W-1`` are workers, the rest parameter-server shards.  Workers talk to each other
over MPI (dense gradients) and to the shards over gRPC (sparse rows); the only world-wide MPI
traffic is at start (token, session, PS addresses) and at the end (a non-blocking barrier).
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from mpi4py import MPI

from cpu_dist.common.addresses import choose_publish_address, interface_address, this_node

T = TypeVar("T")

# Where a job's errors come with a traceback: "1" for every failure, "0" for none; unset, only
# unexpected failures (bugs) show one.  The one switch, documented in docs/operations.md ("Errors").
TRACEBACK_ENV = "CPU_DIST_TRACEBACK"
EXIT_ERROR = 2  # an expected failure: the code a bad flag gets, for the whole job
EXIT_BUG = 1  # anything else
# A job stopped on request (SIGTERM or SIGUSR1) after writing a checkpoint at the step
# boundary: BSD's EX_TEMPFAIL, "try again later"; the sbatch script requeues on it and the
# requeued run resumes.  The one definition (scripts/slurm/train.sbatch repeats the number).
EXIT_STOPPED = 75
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
STOP_TAG = 7501  # a PS rank's stop request, sent to world rank 0 (worker 0)


class JobError(RuntimeError):
    """A verdict every rank reached together (one exchange said so): world rank 0 prints it
    as one ``launcher.py: error:`` line and every rank exits 2, without an abort."""


def _traceback_wanted(expected: bool) -> bool:
    switch = os.environ.get(TRACEBACK_ENV, "")
    return switch == "1" or (switch != "0" and not expected)


@dataclass
class Roles:
    world: MPI.Intracomm
    rank: int
    size: int
    worker_num: int
    is_worker: bool
    comm: MPI.Intracomm  # workers among themselves, or PS ranks among themselves
    role_rank: int  # index within the role (worker index or PS shard index)
    role_size: int

    @property
    def name(self) -> str:
        kind = "worker" if self.is_worker else "ps"
        return f"rank {self.rank} ({kind} {self.role_rank})"

    @property
    def num_ps_ranks(self) -> int:
        return self.size - self.worker_num


def split_roles(worker_num: int, world: MPI.Intracomm | None = None) -> Roles:
    world = world or MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    if not 1 <= worker_num <= size:
        raise ValueError(f"--worker-num {worker_num} does not fit a world of {size} ranks")
    is_worker = rank < worker_num
    comm = world.Split(color=0 if is_worker else 1, key=rank)
    assert isinstance(comm, MPI.Intracomm)
    return Roles(world, rank, size, worker_num, is_worker, comm, comm.Get_rank(), comm.Get_size())


def share_job_secret(roles: Roles, external_token: str | None = None) -> tuple[str, int]:
    """Rank 0 makes the job token (unless the shards were started with one) and a session id."""
    mine = None
    if roles.rank == 0:
        mine = (external_token or secrets.token_hex(16), secrets.randbits(63))
    return roles.world.bcast(mine, root=0)


def ps_listen_host(roles: Roles, requested: str | None, interface: str | None = None) -> str:
    """The address this rank's shard listens on and publishes (never 0.0.0.0): ``--ps-host``,
    else ``--ps-interface``'s address, else loopback when the whole job is on one node, else
    the address other nodes reach this one at (``cpu_dist.common.addresses``).  Collective."""
    nodes = roles.world.allgather(this_node())
    host, error = requested, None
    try:
        if not host and interface:
            host = interface_address(interface)
        elif not host:
            same = all(n == nodes[0] for n in nodes)
            host = "127.0.0.1" if same else choose_publish_address(nodes[roles.rank], nodes)
    except RuntimeError as exc:  # the verdict is shared: one message, every rank exits 2
        error = f"rank {roles.rank}: {exc}"
    errors = [e for e in roles.world.allgather(error) if e]
    if errors:
        raise JobError(errors[0])
    assert host is not None
    return host


def exchange_ps_addresses(
    roles: Roles, address: str | None, error: str | None, timeout_s: float
) -> list[str]:
    """Allgather every PS rank's bound address; every rank raises if any shard failed to start.

    The ranks meet in ``wait_all`` first (at most ``timeout_s``, the job's
    ``--barrier-timeout``): a shard is ready long before the workers have imported torch,
    and a blocking allgather would spin its core all that time (OpenMPI polls), on the
    cores the workers are importing on."""
    wait_all(roles.world, timeout_s, "PS address exchange")
    items = roles.world.allgather((roles.rank, address, error))
    failures = [f"rank {r}: {e}" for r, _, e in items if e]
    if failures:
        raise JobError("PS shard failed to start: " + "; ".join(failures))
    return [a for r, a, _ in items if r >= roles.worker_num]


class StopRequest:
    """Whether this process was asked to stop (``STOP_SIGNALS``).  Signals are per process,
    so there is one of these per process (``STOP``); ``install`` replaces the signals' default
    action (die at once) with a note that the training loop reads at its next step boundary,
    where the workers agree (``agreed``), write a checkpoint and end with ``EXIT_STOPPED``.
    PS ranks install it too: they keep serving until worker 0 sends Shutdown, and ``relay``
    a request of their own to worker 0, which ``agreed`` picks up (an ``Iprobe`` per step)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._relayed: MPI.Request | None = None

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._note)

    def _note(self, signum: int, _frame: object) -> None:
        self.signal = signum  # only a note: the handler may run between any two bytecodes

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def relay(self, world: MPI.Intracomm) -> None:
        """On a PS rank: passes a stop request on to world rank 0, once."""
        if self.signal is not None and self._relayed is None:
            self._relayed = world.Isend(np.array([self.signal], dtype=np.int32), 0, STOP_TAG)

    def _relayed_to_me(self, world: MPI.Intracomm) -> None:
        status = MPI.Status()
        if world.Get_rank() == 0 and world.Iprobe(MPI.ANY_SOURCE, STOP_TAG, status):
            buf = np.zeros(1, dtype=np.int32)
            world.Recv(buf, status.Get_source(), STOP_TAG)
            if self.signal is None:
                self.signal = int(buf[0])

    def agreed(self, comm: MPI.Intracomm) -> bool:
        """Collective over ``comm`` (the workers, at the same step boundary): True when any
        of them, or a PS rank (relayed to worker 0), was asked to stop, so that all stop at
        the same step."""
        self._relayed_to_me(MPI.COMM_WORLD)
        flag = np.array([1 if self.requested else 0], dtype=np.int32)
        if comm.Get_size() > 1:
            comm.Allreduce(MPI.IN_PLACE, flag, op=MPI.MAX)
        return bool(flag[0])


STOP = StopRequest()


def agree_exit_code(
    comm: MPI.Intracomm, code: int, timeout_s: float, what: str, poll_s: float = 0.005
) -> int:
    """The end-of-job meeting of every rank (``wait_all``'s sleeping poll and bound) that
    also agrees on the job's exit code: the highest any rank brings (0, or EXIT_STOPPED)."""
    mine = np.array([code], dtype=np.int32)
    out = np.zeros(1, dtype=np.int32)
    req = comm.Iallreduce(mine, out, op=MPI.MAX)
    deadline = time.monotonic() + timeout_s
    while not req.Test():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: other ranks did not arrive within {timeout_s:.0f} s")
        time.sleep(poll_s)
    return int(out[0])


def allgather_keys(comm: MPI.Intracomm, keys: np.ndarray) -> np.ndarray:
    """Every rank's int64 keys, concatenated in rank order (the per-step id exchange)."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    counts = np.array(comm.allgather(len(keys)), dtype=np.int64)
    out = np.empty(int(counts.sum()), dtype=np.int64)
    comm.Allgatherv(keys, [out, counts])
    return out


def allgather_tables(comm: MPI.Intracomm, parts: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per table, every rank's int64 keys concatenated in rank order: one exchange for all
    tables (each rank's keys table after table, then cut back by every rank's counts)."""
    names = list(parts)
    counts = np.array([len(parts[n]) for n in names], dtype=np.int64)
    every = np.asarray(comm.allgather(counts), dtype=np.int64).reshape(-1, len(names))
    flat = allgather_keys(comm, np.concatenate([np.asarray(parts[n], np.int64) for n in names]))
    # rank r's block is its keys of table 0, then of table 1, ...: table t's share of it
    # starts at the block's start plus its counts of the tables before t
    starts = np.concatenate([[0], np.cumsum(every.sum(axis=1))[:-1]])
    inner = np.concatenate([np.zeros((len(every), 1), np.int64), np.cumsum(every, axis=1)], 1)
    return {
        name: np.concatenate(
            [flat[starts[r] + inner[r, t] : starts[r] + inner[r, t + 1]] for r in range(len(every))]
        )
        for t, name in enumerate(names)
    }


def wait_all(comm: MPI.Intracomm, timeout_s: float, what: str, poll_s: float = 0.005) -> None:
    """A barrier that sleeps instead of spinning a core, and gives up after ``timeout_s``."""
    req = comm.Ibarrier()
    deadline = time.monotonic() + timeout_s
    while not req.Test():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: other ranks did not arrive within {timeout_s:.0f} s")
        time.sleep(poll_s)


def run_or_abort(
    fn: Callable[[], T],
    describe: Callable[[], str],
    expected: Callable[[BaseException], bool] = lambda exc: False,
) -> T | int:
    """Run a rank's main.  A ``JobError`` (every rank has it) returns 2 with one message from
    world rank 0; an ``expected`` failure (unreachable shard, corrupt data, ...) prints one
    ``launcher.py: error:`` line naming the rank and the cause and ends the whole job with
    code 2; anything else is a bug: its message and traceback, and code 1.  Tracebacks follow
    ``$CPU_DIST_TRACEBACK`` (``_traceback_wanted``)."""
    try:
        return fn()
    except SystemExit:
        raise
    except JobError as exc:
        if MPI.COMM_WORLD.Get_rank() == 0:
            sys.stderr.write(f"launcher.py: error: {exc}\n")
            if _traceback_wanted(expected=True):
                traceback.print_exc(file=sys.stderr)
            sys.stderr.flush()
        return EXIT_ERROR
    except BaseException as exc:
        known = expected(exc)
        who, what = describe(), f"{type(exc).__name__}: {exc}"
        sys.stderr.write(
            f"launcher.py: error: {who} failed: {what}\n"
            if known
            else f"cpu_dist: {who} failed: {what}\n"
        )
        if _traceback_wanted(expected=known):
            traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(EXIT_ERROR if known else EXIT_BUG)
        raise
