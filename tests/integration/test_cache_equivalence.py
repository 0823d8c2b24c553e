"""The cache stage changes no bit: cached training (--read-mode bagpipe) equals uncached
training bit for bit (W = 2, online and prescan, ps and collective aggregation), and equals the
single-process reference to rtol 1e-5 (atol 1e-6; the reference sums in another order) for
W in {2, 3} (every mode) and W = 1 (online, ps), with a cache of 2 units (128 rows) while each
worker reads hundreds of rows per step, so rows are evicted and (ps, W > 1) invalidated every
step.

GPU_CACHE_VERIFY=1 (VERIFY, given to every cached job) makes every worker check, after the last
commit, that each resident row equals its PS row.  No GPU here: the cache's torch code runs on
the CPU device.
"""

from __future__ import annotations

import pytest

from cpu_dist.common.metrics_log import read_records

from .launch import assert_dumps_close, assert_dumps_equal, train
from .test_equivalence import reference

pytestmark = pytest.mark.timeout(600)

# No low-hit bypass: every read goes through the tiny cache, to stress coherence.
CACHE = [
    "--read-mode",
    "bagpipe",
    "--optimization-cache-capacity",
    "2",
    "--optimization-bypass-below",
    "0",
]


# The cached jobs' environment; the uncached jobs have no cache to check (and so are the
# very jobs of test_equivalence, which train() runs once a session).
VERIFY = {"GPU_CACHE_VERIFY": "1"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("cache"), {"ref": reference("sgd")}


def _cached(tmp, name, workers, aggregation, prescan):
    metrics = tmp / f"{name}.jsonl"
    extra = [*CACHE, "--aggregation", aggregation, "--metrics-out", str(metrics)]
    if prescan:
        extra.append("--optimization-prescan")
    got = train(tmp, name, workers, 1, extra, env=VERIFY)
    lines = read_records(metrics)
    return (
        got,
        [x for x in lines if "cache_lookups" in x and "summary" not in x],
        next(x["summary"] for x in lines if "summary" in x),
    )


# W = 2 and 3 in every mode; W = 1 once (online, ps): the one check that needs W > 1 is
# invalidation (no other worker commits), so the three other one-worker jobs asserted only
# what the two- and three-worker jobs of their modes assert (26 s of jobs here, 2 loaded cores).
CASES = [
    pytest.param(w, aggregation, prescan, id=f"{w}-{('online', 'prescan')[prescan]}-{aggregation}")
    for w in (1, 2, 3)
    for prescan in (False, True)
    for aggregation in ("ps", "collective")
    if w > 1 or (aggregation, prescan) == ("ps", False)
]


@pytest.mark.parametrize("workers,aggregation,prescan", CASES)
def test_cached_equals_reference(runs, workers, aggregation, prescan):
    tmp, cache = runs
    name = f"w{workers}-{aggregation}-{'prescan' if prescan else 'online'}"
    got, steps, summary = _cached(tmp, name, workers, aggregation, prescan)
    assert_dumps_close(got, cache["ref"], 1e-5, name)
    cache[(workers, aggregation, prescan)] = got
    # The cache was under pressure in every logged window of 5 steps, and still hit.
    prev = {"cache_evictions": 0, "cache_invalidations": 0}
    for rec in steps:
        assert rec["cache_evictions"] > prev["cache_evictions"], rec
        if aggregation == "ps" and workers > 1:
            assert rec["cache_invalidations"] > prev["cache_invalidations"], rec
        prev = rec
    assert summary["cache_hits"] > 0 and summary["cache_resident_bytes"] == 2 * 64 * 8 * 4
    if prescan:
        assert summary["prescan_startup_s"] > 0 and "prescan_shutdown_s" in summary
        assert summary["cache_prefetch_used"] > 0
    if prescan and aggregation == "collective":
        # Every miss after step 0 was staged before the commit that changed it and brought
        # forward locally: no read ever waited for a commit, and the result is still exact.
        assert summary["cache_staged_updates"] > 0
        assert summary["cache_dependency_waits"] == 0, summary


@pytest.mark.parametrize("aggregation", ["ps", "collective"])
def test_cached_equals_uncached_bit_for_bit(runs, aggregation):
    tmp, cache = runs
    plain = train(tmp, f"plain-{aggregation}", 2, 1, ["--aggregation", aggregation])
    for prescan in (False, True):
        got = (
            cache.get((2, aggregation, prescan))
            or _cached(tmp, f"again-{aggregation}-{prescan}", 2, aggregation, prescan)[0]
        )
        assert_dumps_equal(got, plain, f"cached W=2 {aggregation} prescan={prescan} vs uncached")


def test_seed_example_line_trains(runs):
    """The seed design's example flags, verbatim, on the small model (8192 units: no eviction)."""
    tmp, cache = runs
    got = train(
        tmp,
        "seed-line",
        2,
        1,
        [
            "--ps-type",
            "RDMA",
            "--read-mode",
            "bagpipe",
            "--optimization-prescan",
            "--optimization-cache-capacity",
            "8192",
            "--bagpipe-aggregation",
            "ps",
        ],
        env=VERIFY,
    )
    assert_dumps_close(got, cache["ref"], 1e-5, "the seed's example line")
