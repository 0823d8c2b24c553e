"""pytest-mpi tests run on every rank: one failing rank must end the run, not hang the others.

A rank whose test fails prints the failure and aborts COMM_WORLD, so ranks blocked in a
collective with it are killed by mpirun at once and the run exits non-zero.
"""

from __future__ import annotations

import sys

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.get_closest_marker("mpi") is not None:
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.Get_rank()
        sys.stderr.write(
            f"\n[rank {rank}] {item.nodeid} failed in {report.when}:\n{report.longreprtext}\n"
        )
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
