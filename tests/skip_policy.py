"""A pytest plugin for what a run does not run: required groups, and the MPI tests' phase.

Where a machine can run a group of tests, their skip is a failure.

Some tests skip themselves, with the reason, where the machine cannot host what they need
(the network lab of ``test_hosts.py`` needs root and ``ip netns``; ``test_slurm.py`` needs
slurm-wlm and munge).  That is right on a laptop and wrong on CI, where a skip would hide a
broken lab behind a green run.  So the groups are markers, and ``CPU_DIST_REQUIRE`` (a comma
list of group names, set by ``.ci/run``) names the groups that must run: a skip of a test so
marked is reported as a failure that says what was required and why the test skipped.

``--deselect-mpi`` leaves out the pytest-mpi tests (marked ``mpi``) and ``--deselect-non-mpi``
all others: scripts/test.sh runs the first in its MPI phases under mpirun and the others in its
unit phase, so each phase deselects the other's tests instead of reporting them as skips
("need --with-mpi", "test does not use mpi") that are not missing from the run.

The root ``conftest.py`` loads this plugin for every test run from the checkout;
``scripts/test.sh`` also names it with ``-p`` so it holds for test files outside the checkout.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

ENV = "CPU_DIST_REQUIRE"
# group (= marker name) -> what its tests need, for ``--markers`` and the failure message
GROUPS = {
    "netlab": "the network lab: network namespaces and veth links (root and ip netns)",
    "slurm": "a private one-node Slurm cluster (slurm-wlm and munge)",
}


def required_groups(value: str | None) -> frozenset[str]:
    """The groups named by a ``CPU_DIST_REQUIRE`` value; an unknown name is an error (a typo
    must not silently require nothing)."""
    names = {n.strip() for n in (value or "").split(",")} - {""}
    unknown = sorted(names - GROUPS.keys())
    if unknown:
        raise pytest.UsageError(
            f"{ENV}={value}: unknown test group(s) {', '.join(unknown)}; "
            f"known groups: {', '.join(sorted(GROUPS))}"
        )
    return frozenset(names)


REQUIRED = pytest.StashKey[frozenset[str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--deselect-mpi",
        action="store_true",
        help="leave out the tests marked mpi (another run executes them under mpirun)",
    )
    parser.addoption(
        "--deselect-non-mpi",
        action="store_true",
        help="leave out the tests not marked mpi (another run executes them)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    drop = {True: config.getoption("--deselect-mpi"), False: config.getoption("--deselect-non-mpi")}
    kept = [i for i in items if not drop[i.get_closest_marker("mpi") is not None]]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept


def pytest_configure(config: pytest.Config) -> None:
    for name, needs in GROUPS.items():
        config.addinivalue_line(
            "markers", f"{name}: needs {needs}; a skip fails under {ENV}={name}"
        )
    config.stash[REQUIRED] = required_groups(os.environ.get(ENV))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    required = item.config.stash.get(REQUIRED, frozenset())
    if not report.skipped or hasattr(report, "wasxfail") or not required:
        return report
    groups = sorted(g for g in required if item.get_closest_marker(g) is not None)
    if not groups:
        return report
    longrepr = report.longrepr
    reason = longrepr[2].removeprefix("Skipped: ") if isinstance(longrepr, tuple) else str(longrepr)
    where = f"{longrepr[0]}:{longrepr[1]}" if isinstance(longrepr, tuple) else item.nodeid
    report.outcome = "failed"
    report.longrepr = (
        f"{item.nodeid} was skipped, but {ENV}={os.environ.get(ENV)} requires the "
        f"{', '.join(groups)} tests to run on this machine.\n"
        f"The skip ({where}): {reason}"
    )
    return report
