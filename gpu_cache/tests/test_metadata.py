"""CacheMetadata (C++) through its binding: LRU order, bounded admission with unique
destinations, invalidation, previous-update tracking, capacity edge cases."""

import numpy as np
import pytest

from gpu_cache._metadata import BagPipeCacheMetadata

pytestmark = pytest.mark.timeout(30)


def keys(*k):
    return np.array(k, dtype=np.int64)


def resident(m):
    return set(m.resident()[0].tolist())


def test_lru_evicts_least_recently_used():
    m = BagPipeCacheMetadata(3)
    m.admit(keys(1, 2, 3))
    m.query(keys(1))  # 2 is now the oldest
    _slots, _src, evicted = m.admit(keys(4))
    assert evicted.tolist() == [2] and resident(m) == {1, 3, 4}
    m.query(keys(3, 1))
    _, _, evicted = m.admit(keys(5))
    assert evicted.tolist() == [4]


def test_query_reports_hits_with_slots():
    m = BagPipeCacheMetadata(4)
    slots, _src, _ = m.admit(keys(10, 20))
    pos, hit_slots = m.query(keys(5, 20, 10, 7))
    assert pos.tolist() == [1, 2]
    assert hit_slots.tolist() == [slots[1], slots[0]]
    assert m.lookup(keys(10, 7)).tolist() == [slots[0], -1]


def test_oversized_batch_has_unique_destinations_and_final_sources():
    m = BagPipeCacheMetadata(2)
    batch = keys(1, 2, 3, 4, 5)
    slots, src, evicted = m.admit(batch, max_admit=10)  # more than the cache holds
    assert len(set(slots.tolist())) == len(slots) == 2
    assert sorted(batch[src].tolist()) == [4, 5]  # the last writer of each slot wins
    assert resident(m) == {4, 5}
    assert evicted.tolist() == []  # nothing resident before was dropped
    # What a scatter with these destinations leaves is exactly the resident mapping.
    storage = np.full(2, -1)
    storage[slots] = batch[src]
    k, s = m.resident()
    assert storage[s].tolist() == k.tolist()


def test_admission_is_bounded():
    m = BagPipeCacheMetadata(64)
    slots, src, _ = m.admit(np.arange(100, dtype=np.int64), max_admit=64)
    assert len(slots) == 64 and m.size == 64
    assert src.tolist() == list(range(64))
    slots, _, evicted = m.admit(np.arange(100, 200, dtype=np.int64), max_admit=5)
    assert len(slots) == 5 and len(evicted) == 5


def test_admit_skips_resident_and_duplicate_keys():
    m = BagPipeCacheMetadata(4)
    m.admit(keys(1))
    _slots, src, _ = m.admit(keys(1, 2, 2, 3))
    assert src.tolist() == [1, 3] and m.size == 3


def test_score_gate_keeps_rows_needed_sooner():
    m = BagPipeCacheMetadata(2)
    m.admit(keys(1, 2), scores=keys(-5, -9), score_gate=True)  # next uses: steps 5 and 9
    slots, _src, evicted = m.admit(keys(3), scores=keys(-20), score_gate=True)
    assert len(slots) == 0 and resident(m) == {1, 2}  # 3 is needed later than both
    slots, _src, evicted = m.admit(keys(4), scores=keys(-6), score_gate=True)
    assert evicted.tolist() == [2] and resident(m) == {1, 4}  # 2 (step 9) was farthest


def test_invalidation_frees_slots():
    m = BagPipeCacheMetadata(2)
    m.admit(keys(1, 2))
    assert m.invalidate(keys(2, 9)) == 1
    assert resident(m) == {1}
    _, _, evicted = m.admit(keys(3))
    assert evicted.tolist() == [] and resident(m) == {1, 3}
    m.clear()
    assert m.size == 0 and resident(m) == set()


def test_previous_update_tracking():
    m = BagPipeCacheMetadata(1)
    assert m.previous_update(keys(1, 2)).tolist() == [-1, -1]
    m.record_updates(keys(1, 2), 0)
    m.record_updates(keys(2), 3)
    m.record_updates(keys(2), 1)  # an older step never moves it back
    assert m.previous_update(keys(1, 2, 3)).tolist() == [0, 3, -1]


def test_capacity_one_unit_and_single_row():
    m = BagPipeCacheMetadata(64)  # one unit of 64 rows
    slots, _, _ = m.admit(np.arange(1000, dtype=np.int64), max_admit=1000)
    assert sorted(slots.tolist()) == list(range(64)) and m.size == 64
    one = BagPipeCacheMetadata(1)
    slots, src, _ = one.admit(keys(7, 8, 9), max_admit=3)
    assert slots.tolist() == [0] and src.tolist() == [2] and resident(one) == {9}
    with pytest.raises(ValueError):
        BagPipeCacheMetadata(0)


def test_rejects_bad_arguments():
    m = BagPipeCacheMetadata(4)
    with pytest.raises(ValueError):
        m.query(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError):
        m.admit(keys(1, 2), scores=keys(1))
