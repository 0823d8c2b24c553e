"""The background loader: order, determinism, bounds, errors, stopping."""

import threading

import numpy as np
import pytest

from cpu_dist.data import Batch, SyntheticCriteo, WorkerBatches

pytestmark = pytest.mark.timeout(60)


class Recorded:
    """A dataset of ``steps`` steps that records which steps were asked for."""

    def __init__(self, steps: int | None = None, fail_at: int | None = None) -> None:
        self.steps, self.fail_at = steps, fail_at
        self.asked: list[int] = []
        self.lock = threading.Lock()
        self.asked_event = threading.Condition(self.lock)

    def worker_batch(self, step, batch_size, rank, world):
        with self.lock:
            self.asked.append(step)
            self.asked_event.notify_all()
        if step == self.fail_at:
            raise ValueError(f"bad.tsv:{step}: label must be 0 or 1")
        if self.steps is not None and step >= self.steps:
            return None
        n = batch_size // world
        v = np.full((n, 1), step * 100 + rank, np.int64)
        return Batch(dense=v.astype(np.float32), keys=v, labels=np.zeros(n, np.float32))

    def wait_asked(self, count: int, timeout: float = 10.0) -> bool:
        with self.lock:
            return self.asked_event.wait_for(lambda: len(self.asked) >= count, timeout)


def _threads_named(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


@pytest.mark.parametrize("threads", [1, 3])
def test_steps_in_order_from_start_to_the_end_of_the_data(threads):
    ds = Recorded(steps=11)
    with WorkerBatches(ds, 8, 4, 1, 2, threads=threads) as wb:
        got = [(s, int(b.keys[0, 0])) for s, b in wb]
    assert got == [(s, s * 100 + 1) for s in range(4, 11)]
    assert not wb.alive


def test_stop_step_bounds_the_steps_and_the_thread_ends_by_itself():
    ds = Recorded()
    wb = WorkerBatches(ds, 8, 0, 0, 1, stop_step=5)
    assert [s for s, _ in wb] == [0, 1, 2, 3, 4]
    assert not wb.alive and max(ds.asked) == 4


def test_same_batches_as_reading_in_line():
    ds = SyntheticCriteo(seed=4)
    with WorkerBatches(ds, 64, 2, 1, 4, stop_step=8, threads=2) as wb:
        for step, batch in wb:
            want = ds.global_batch(step, 64).shard(1, 4)
            np.testing.assert_array_equal(batch.keys, want.keys)
            np.testing.assert_array_equal(batch.dense, want.dense)


def test_at_most_depth_batches_are_made_ahead():
    ds = Recorded()
    wb = WorkerBatches(ds, 8, 0, 0, 1, depth=2)
    try:
        assert ds.wait_asked(3)  # two queued, the third made and waiting to be queued
        assert not ds.wait_asked(4, timeout=0.3)
        next(wb)
        assert ds.wait_asked(4)
    finally:
        wb.close()
    assert not wb.alive


def test_hold_pauses_the_threads_until_release():
    ds = Recorded()
    wb = WorkerBatches(ds, 8, 0, 0, 1, depth=1, hold=True)
    try:
        assert ds.wait_asked(2)  # one queued, one made and waiting for room
        assert next(wb)[0] == 0
        assert not ds.wait_asked(3, timeout=0.3)  # held: no new batch is started
        wb.release()
        assert ds.wait_asked(3)
        assert [next(wb)[0] for _ in range(3)] == [1, 2, 3]  # next() alone also lets them go
    finally:
        wb.close()


def test_close_leaves_no_thread_behind():
    before = len(_threads_named("cpu_dist-data"))
    wb = WorkerBatches(Recorded(), 8, 0, 0, 1, threads=2)
    next(wb)
    wb.close()
    assert not wb.alive and len(_threads_named("cpu_dist-data")) == before
    with pytest.raises(StopIteration):
        next(wb)
    wb.close()  # twice is harmless


def test_an_error_reaches_the_consumer_at_its_step_with_its_message():
    ds = Recorded(fail_at=3)
    wb = WorkerBatches(ds, 8, 0, 0, 1, threads=2)
    assert [next(wb)[0] for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"bad.tsv:3: label must be 0 or 1"):
        next(wb)
    assert not wb.alive
    with pytest.raises(StopIteration):
        next(wb)


def test_bad_arguments():
    with pytest.raises(ValueError, match="bad share"):
        WorkerBatches(Recorded(), 10, 0, 0, 3)
    with pytest.raises(ValueError):
        WorkerBatches(Recorded(), 8, -1, 0, 1)


def test_prepare_runs_on_the_thread_and_goes_with_its_share():
    ds = Recorded(steps=6)
    main = threading.current_thread()
    ran_on = []

    def prepare(batch):
        ran_on.append(threading.current_thread())
        return int(batch.keys[0, 0]) * 2

    with WorkerBatches(ds, 8, 1, 0, 1, threads=2, prepare=prepare) as wb:
        got = [(s, wb.prepared) for s, _ in wb]
    assert got == [(s, s * 200) for s in range(1, 6)]
    assert ran_on and main not in ran_on
