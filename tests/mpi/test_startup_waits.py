"""The start-up exchange waits asleep: a shard that is up long before the workers (they are
still importing torch) must not spin a core the workers need (OpenMPI polls inside a blocking
collective).

Run: mpirun -np 3 (or 4) python -m pytest --with-mpi --only-mpi tests/mpi
"""

from __future__ import annotations

import time

import pytest
from mpi4py import MPI

from cpu_dist.common.mpi_context import exchange_ps_addresses, split_roles

pytestmark = [pytest.mark.mpi(min_size=3), pytest.mark.timeout(120)]
LATE_S = 1.5  # how late worker 0 comes: the stand-in for its imports, not a synchronisation


def test_ranks_waiting_for_a_late_worker_use_almost_no_cpu():
    world = MPI.COMM_WORLD
    roles = split_roles(world.Get_size() - 1, world)  # the last rank is the shard
    address = "127.0.0.1:1" if not roles.is_worker else None
    if roles.rank == 0:
        time.sleep(LATE_S)
    wall, cpu = time.monotonic(), time.process_time()
    got = exchange_ps_addresses(roles, address, None, timeout_s=60)
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    assert got == ["127.0.0.1:1"]
    if roles.rank != 0:  # waited for worker 0 the whole LATE_S
        assert wall > 0.8 * LATE_S, f"rank {roles.rank}: did not wait ({wall:.2f} s)"
        # A polling wait takes a core's share for all of it; a sleeping one a few percent.
        assert cpu < 0.2 * wall, f"rank {roles.rank}: {cpu:.2f} s of CPU in {wall:.2f} s"
