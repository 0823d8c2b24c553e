"""CachedRowReader against an in-memory PS (one worker): every read equals the PS rows,
prescan detects a changed id sequence, cache SGD's strict and best-effort contracts."""

import numpy as np
import pytest
import torch

from cpu_dist.sparse.aggregation import Outgoing
from gpu_cache._metadata import BagPipeCacheMetadata
from gpu_cache.cache_sgd import best_effort_sgd, strict_sgd
from gpu_cache.controller import CachedRowReader
from gpu_cache.plans import OnlinePlanner, PrescanMismatch, PrescanPlanner
from gpu_cache.storage import RowStorage

pytestmark = pytest.mark.timeout(60)
DIM, LR = 4, 0.1


class OneRankComm:
    def Get_size(self):
        return 1

    def Get_rank(self):
        return 0


class DictPS:
    """Rows keyed by id; first touch is a function of the key; SGD as the PS applies it."""

    def __init__(self):
        self.rows, self.pulled = {}, 0

    def _row(self, k):
        return self.rows.setdefault(int(k), np.full(DIM, k % 7 / 7.0, dtype=np.float32))

    def pull(self, keys):
        self.pulled += len(keys)
        return (
            np.stack([self._row(k) for k in keys]) if len(keys) else np.zeros((0, DIM), np.float32)
        )

    def apply(self, keys, grads, world=1):
        for k, g in zip(keys, grads):
            self.rows[int(k)] = self._row(k) - np.float32(LR) * (g / np.float32(world))


class InstantCommits:
    """gpu_cache.controller.Commits whose commits apply at once (the barrier case); tracks
    what the reader waited for."""

    def __init__(self, ps):
        self.ps, self.committed, self.waits = ps, -1, []

    def submit(self, step, keys, grads, union=None, then=None):
        self.ps.apply(keys, grads)
        self.committed = step
        # one worker: its gradients are the whole sum of the rows the step writes
        out = Outgoing(keys, grads, written=keys, summed=grads)
        if then is not None:
            then(out)
        return out

    def drain(self):
        pass

    def wait_readable(self, step):
        self.waits.append(step)

    def wait_applied(self, step):
        assert step <= self.committed, "staged a pull that no commit would ever allow"

    def finish(self, last_step):
        assert self.committed == last_step


def train_through(reader, ps, tr, seed):
    """Read and submit every step of ``tr``; every read must equal the PS rows."""
    rng = np.random.default_rng(seed)
    for step, keys in enumerate(tr):
        rows = reader.read(step, keys)
        np.testing.assert_array_equal(rows.numpy(), np.stack([ps._row(k) for k in keys]))
        reader.submit(step, keys, rng.standard_normal((len(keys), DIM)).astype(np.float32))
    reader.close()


def trace(steps=30, seed=0):
    rng = np.random.default_rng(seed)
    return [np.unique(rng.zipf(1.3, size=200) % 500).astype(np.int64) for _ in range(steps)]


@pytest.mark.parametrize("prescan", [False, True])
def test_reads_equal_ps_rows_under_eviction(prescan):
    ps = DictPS()
    up = InstantCommits(ps)
    tr = trace()
    planner = PrescanPlanner(OneRankComm(), tr) if prescan else OnlinePlanner(OneRankComm())
    reader = CachedRowReader(
        ps, up, planner, dim=DIM, capacity_units=1, lr=LR, aggregation="ps", world=1, device="cpu"
    )
    rng = np.random.default_rng(1)
    for step, keys in enumerate(tr):
        rows = reader.read(step, keys)
        want = np.stack([ps._row(k) for k in keys])
        np.testing.assert_array_equal(rows.numpy(), want)
        grads = rng.standard_normal((len(keys), DIM)).astype(np.float32)
        reader.submit(step, keys, grads)
    reader.close()
    m = reader.metrics()
    assert m["cache_hits"] > 0 and m["cache_evictions"] > 0 and m["cache_local_updates"] > 0
    assert m["cache_resident_bytes"] == 64 * DIM * 4
    reader.verify()
    if prescan:
        assert m["cache_prefetch_used"] > 0 and m["prescan_startup_s"] > 0
        # after step 0 every miss was staged and brought forward by the step's own update
        assert m["cache_demand_ids"] == len(tr[0])


@pytest.mark.parametrize("aggregation", ["ps", "collective"])
def test_staged_rows_take_the_step_update(aggregation):
    """The same 100 keys every step and room for 64: the rest are staged for the next step
    before this step's commit, and must be brought forward by this step's update."""
    ps = DictPS()
    up = InstantCommits(ps)
    tr = [np.arange(100, dtype=np.int64)] * 6
    reader = CachedRowReader(
        ps,
        up,
        PrescanPlanner(OneRankComm(), tr),
        dim=DIM,
        capacity_units=1,
        lr=LR,
        aggregation=aggregation,
        world=1,
        device="cpu",
    )
    train_through(reader, ps, tr, seed=2)
    m = reader.metrics()
    assert m["cache_staged_updates"] == 5 * 36 and m["cache_prefetch_used"] == 5 * 36
    assert m["cache_demand_ids"] == 100 and up.waits == []
    reader.verify()


def test_prescan_detects_changed_ids():
    tr = trace(steps=3)
    planner = PrescanPlanner(OneRankComm(), tr)
    planner.plan(0, tr[0])
    changed = tr[1].copy()
    changed[0] += 100_000
    with pytest.raises(PrescanMismatch, match="differ from the scanned trace"):
        planner.plan(1, changed)
    with pytest.raises(PrescanMismatch, match="past the 3 scanned steps"):
        planner.plan(3, tr[0])


def test_prescan_scores_are_minus_next_use():
    tr = [np.array([1, 2]), np.array([2]), np.array([1, 3])]
    p = PrescanPlanner(OneRankComm(), tr)
    assert p.plans[0].scores[0] == -2 and p.plans[0].scores[1] == -1
    assert p.plans[2].scores.tolist() == [p.plans[1].scores[0]] * 2  # never again: FAR
    windowed = PrescanPlanner(OneRankComm(), tr, window=1)
    assert windowed.plans[0].scores[0] == windowed.plans[1].scores[0]  # step 2 is past the window


def _cache_with(keys):
    meta, st = BagPipeCacheMetadata(64), RowStorage(1, DIM, "cpu")
    slots, src, _ = meta.admit(keys)
    st.scatter(slots, torch.ones(len(src), DIM)[src])
    return meta, st


def test_strict_sgd_sums_duplicates_and_updates_once():
    meta, st = _cache_with(np.array([5, 6], dtype=np.int64))
    g = np.ones((3, DIM), dtype=np.float32)
    assert strict_sgd(meta, st, np.array([5, 5, 6]), g, lr=0.5, divisor=2)
    s5, s6 = meta.lookup(np.array([5, 6]))
    assert torch.allclose(st.rows[s5], torch.full((DIM,), 0.5))  # 1 - 0.5 * 2/2
    assert torch.allclose(st.rows[s6], torch.full((DIM,), 0.75))  # 1 - 0.5 * 1/2


def test_strict_sgd_missing_row_invalidates_requested_keys():
    meta, st = _cache_with(np.array([5, 6, 7], dtype=np.int64))
    before = st.rows.clone()
    ok = strict_sgd(meta, st, np.array([5, 9]), np.ones((2, DIM), np.float32), lr=0.5)
    assert not ok
    assert meta.lookup(np.array([5, 6, 7])).tolist()[0] == -1 and meta.size == 2
    assert torch.equal(st.rows, before)


def test_best_effort_sgd_updates_resident_rows_only():
    meta, st = _cache_with(np.array([5], dtype=np.int64))
    assert best_effort_sgd(meta, st, np.array([5, 9]), np.ones((2, DIM), np.float32), lr=0.5) == 1
    assert meta.size == 1
    assert torch.allclose(st.rows[meta.lookup(np.array([5]))[0]], torch.full((DIM,), 0.5))
