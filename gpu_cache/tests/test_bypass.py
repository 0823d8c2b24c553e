"""The low-hit bypass policy, alone and inside the reader."""

import numpy as np
import pytest

from gpu_cache.bypass import LowHitBypass
from gpu_cache.controller import CachedRowReader
from gpu_cache.plans import OnlinePlanner, PrescanPlanner
from gpu_cache.tests.test_controller import (
    DIM,
    LR,
    DictPS,
    InstantCommits,
    OneRankComm,
    train_through,
)

pytestmark = pytest.mark.timeout(60)


def test_bypass_starts_after_a_cold_window_and_probes_back():
    b = LowHitBypass(0.1, window=3, probe_every=4)
    for _ in range(2):
        assert b.use_cache()
        b.record(0, 100)
    assert not b.bypassing  # the window is not full yet
    assert b.use_cache()
    b.record(5, 100)
    assert b.bypassing  # 5 hits in 300 lookups
    assert [b.use_cache() for _ in range(4)] == [False, False, False, True]
    b.record(2, 100)  # a probe that still misses
    assert b.bypassing
    assert [b.use_cache() for _ in range(4)] == [False, False, False, True]
    b.record(50, 100)
    assert not b.bypassing and b.use_cache()


def test_zero_threshold_never_bypasses():
    b = LowHitBypass(0.0, window=1)
    for _ in range(5):
        assert b.use_cache()
        b.record(0, 100)
    assert not b.bypassing


@pytest.mark.parametrize("bad", [-0.1, 1.0])
def test_threshold_out_of_range(bad):
    with pytest.raises(ValueError, match="threshold"):
        LowHitBypass(bad)


def test_prescan_bypass_does_not_pin_rows():
    """A bypassed prescan read still refreshes the scores of its hits: rows whose planned next
    use has passed must stay evictable, or the hot set that follows is never admitted."""
    ps = DictPS()
    up = InstantCommits(ps)
    k0 = np.arange(0, 64, dtype=np.int64)
    tr = [k0, np.arange(1000, 1064, dtype=np.int64), k0] + [
        np.arange(5000, 5064, dtype=np.int64)
    ] * 20
    reader = CachedRowReader(
        ps,
        up,
        PrescanPlanner(OneRankComm(), tr),
        dim=DIM,
        capacity_units=1,
        lr=LR,
        aggregation="ps",
        world=1,
        device="cpu",
        bypass=LowHitBypass(0.2, window=2, probe_every=2),
    )
    train_through(reader, ps, tr, seed=4)
    assert reader.stats["hits"] >= 15 * 64 and not reader.bypass.bypassing
    reader.verify()


def test_reader_bypasses_a_trace_without_reuse_and_stays_exact():
    """Fresh keys every step (no hit is possible), then a hot set: the reader bypasses during
    the cold phase, comes back through a probe, and every read equals the PS rows."""
    ps = DictPS()
    up = InstantCommits(ps)
    cold = [np.arange(1000 + 50 * t, 1050 + 50 * t, dtype=np.int64) for t in range(24)]
    hot = [np.arange(0, 40, dtype=np.int64)] * 24
    reader = CachedRowReader(
        ps,
        up,
        OnlinePlanner(OneRankComm()),
        dim=DIM,
        capacity_units=1,
        lr=LR,
        aggregation="ps",
        world=1,
        device="cpu",
        bypass=LowHitBypass(0.2, window=4, probe_every=4),
    )
    rng = np.random.default_rng(3)
    for step, keys in enumerate(cold + hot):
        rows = reader.read(step, keys)
        np.testing.assert_array_equal(rows.numpy(), np.stack([ps._row(k) for k in keys]))
        reader.submit(step, keys, rng.standard_normal((len(keys), DIM)).astype(np.float32))
        if step == len(cold) - 1:
            cold_bypassed = reader.stats["bypassed_reads"]
    reader.close()
    m = reader.metrics()
    assert cold_bypassed >= 10  # most cold reads skipped the cache
    # In the hot phase the first probe admits the hot rows, the next one hits and ends it.
    assert m["cache_bypassed_reads"] - cold_bypassed <= 2 * 4
    assert not reader.bypass.bypassing
    assert m["cache_hits"] > 0
    reader.verify()
