"""The online cache's previous-update map stays bounded: entries of committed steps are
pruned, and every read still waits for exactly the commits it must."""

import numpy as np
import pytest

from gpu_cache._metadata import BagPipeCacheMetadata

pytestmark = pytest.mark.timeout(60)


def test_map_stays_bounded_over_a_long_trace_and_reads_stay_exact():
    rng = np.random.default_rng(0)
    m = BagPipeCacheMetadata(16)
    truth: dict[int, int] = {}  # every key's last update step, never pruned
    lag, universe, per_step = 3, 200_000, 500
    biggest = 0
    for step in range(2000):
        union = np.unique(rng.integers(0, universe, per_step)).astype(np.int64)
        m.record_updates(union, step)
        truth.update(dict.fromkeys(union.tolist(), step))
        committed = step - lag  # the commits the caller knows are applied
        m.prune_updates(committed)
        biggest = max(biggest, m.update_entries)
        probe = rng.integers(0, universe, 300).astype(np.int64)
        want = [truth.get(k, -1) for k in probe.tolist()]
        want = [s if s > committed else -1 for s in want]  # committed: no wait needed
        assert m.previous_update(probe).tolist() == want, step
    # Only the steps not yet committed are held: lag + 1 unions at most.
    assert biggest <= (lag + 1) * per_step
    assert len(truth) > 50 * biggest  # without pruning the map would hold every key seen


def test_a_key_updated_again_keeps_its_later_step():
    m = BagPipeCacheMetadata(4)
    k = np.array([7, 8], dtype=np.int64)
    m.record_updates(k, 1)
    m.record_updates(k[:1], 3)
    assert m.prune_updates(1) == 1  # key 8; key 7's last update is step 3
    assert m.previous_update(k).tolist() == [3, -1]
    assert m.prune_updates(3) == 1 and m.update_entries == 0
