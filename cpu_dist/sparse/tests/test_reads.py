"""EarlyPull against a real in-process shard: the early part never includes a written row,
and the assembled rows equal one plain pull after the commit; pull_when_applied waits for the
commit it is given; the native passes EarlyPull uses (membership, interleaving) agree with
numpy's."""

import numpy as np
import pytest

from cpu_dist.common.contracts import TABLE
from cpu_dist.common.sorted_keys import find_sorted
from cpu_dist.sparse import Client, Server, _ps_client
from cpu_dist.sparse.reads import (
    AfterCommit,
    EarlyPull,
    TableReads,
    pull_when_applied,
    written_by,
)

pytestmark = pytest.mark.timeout(60)


class Applied:
    """Records the commits a read waited for (the commit itself is applied by hand here)."""

    def __init__(self):
        self.waited = []

    def wait_applied(self, step):
        self.waited.append(step)


@pytest.fixture
def client():
    server = Server(4, "t", init_scale=0.1)
    server.start()
    yield Client([server.address], "t", 4)
    server.stop(2)


def test_early_pull_reads_written_rows_after_the_commit(client):
    written = np.array([3, 5, 9], dtype=np.int64)
    unique = np.array([1, 3, 4, 9, 12], dtype=np.int64)
    commits = Applied()
    reads = TableReads(client, [TABLE], one_table=True)
    early = EarlyPull(reads, 8, {TABLE: unique}, {TABLE: written}, {TABLE: 4})
    np.testing.assert_array_equal(early.part(written=True)[TABLE], [3, 9])
    np.testing.assert_array_equal(early.part(written=False)[TABLE], [1, 4, 12])
    # "commit 7" lands after the early pull started: the written rows change now.
    client.push(written, np.ones((3, 4), np.float32), 1.0)
    rows = early.finish(commits, 10)
    assert commits.waited == [7]
    np.testing.assert_array_equal(rows[TABLE], client.pull(unique))


def test_written_rows_pulled_after_the_commit_come_when_every_shard_applied_it():
    """With after_commit the written rows are pulled at once too, parked on both shards until
    the commit's last chunk arrives: they hold it, and the reply proves it."""
    servers = [Server(4, "t", init_scale=0.1, shard_index=i, num_shards=2) for i in range(2)]
    for s in servers:
        s.start()
    try:
        ranks = [Client([s.address for s in servers], "t", 4) for _ in range(2)]
        written = np.array([3, 5, 9], dtype=np.int64)
        unique = np.array([1, 3, 4, 9, 12], dtype=np.int64)
        grads = np.ones((3, 4), np.float32)
        ranks[0].commit(6, 0, 0, 2, written, grads, 0.5)
        reads = TableReads(ranks[0], [TABLE], one_table=True)
        after = AfterCommit(session=6, step=0, timeout_s=20.0)
        early = EarlyPull(
            reads, 1, {TABLE: unique}, {TABLE: written}, {TABLE: 4}, after_commit=after
        )
        before = ranks[1].pull(unique)
        ranks[1].commit(6, 0, 1, 2, written, grads, 0.5)  # commit 0 complete: applied
        late = early.wait_late(10)
        rows = early.combine(late, early.early.wait(10))
        np.testing.assert_array_equal(rows[TABLE], ranks[1].pull(unique))
        changed = ~np.all(rows[TABLE] == before, axis=1)
        np.testing.assert_array_equal(changed, np.isin(unique, written))
    finally:
        for s in servers:
            s.stop(2)


def test_rows_of_earlier_steps_count_as_written_too(client):
    """The sole writer's early pull: rows that step t or an earlier step wrote wait."""
    unique = np.array([1, 3, 4, 9, 12], dtype=np.int64)
    reads = TableReads(client, [TABLE], one_table=True)
    early = EarlyPull(
        reads,
        8,
        {TABLE: unique},
        {TABLE: np.array([3, 5], np.int64)},
        {TABLE: 4},
        earlier=[{TABLE: np.array([9], np.int64)}, {TABLE: np.array([0, 12], np.int64)}],
    )
    np.testing.assert_array_equal(early.part(written=True)[TABLE], [3, 9, 12])
    np.testing.assert_array_equal(early.early.wait(10)[TABLE], client.pull(np.array([1, 4])))


def test_nothing_written_means_nothing_waits_and_unknown_means_everything_waits(client):
    unique = np.array([1, 3, 4], dtype=np.int64)
    commits = Applied()
    reads = TableReads(client, [TABLE], one_table=True)
    none = EarlyPull(reads, 1, {TABLE: unique}, {TABLE: np.zeros(0, np.int64)}, {TABLE: 4})
    np.testing.assert_array_equal(none.finish(commits, 10)[TABLE], client.pull(unique))
    assert commits.waited == []
    unknown = EarlyPull(reads, 1, {TABLE: unique}, {}, {TABLE: 4})  # a table not named
    assert len(unknown.part(written=False)[TABLE]) == 0
    unknown.discard(10)
    assert written_by(unique, None).all()
    rows = pull_when_applied(client, commits, unique, 4)
    assert commits.waited == [4]
    np.testing.assert_array_equal(rows, client.pull(unique))


@pytest.mark.parametrize("order", ["sorted", "shuffled"])
def test_written_by_is_find_sorted_membership(order):
    rng = np.random.default_rng(4)
    for _ in range(20):
        written = np.unique(rng.integers(-(1 << 62), 1 << 62, rng.integers(0, 60)))
        keys = np.unique(
            np.concatenate([rng.choice(written, len(written) // 2), rng.integers(-9, 9, 30)])
        )
        if order == "shuffled":
            keys = rng.permutation(keys)
        np.testing.assert_array_equal(written_by(keys, written), find_sorted(written, keys)[1])
    assert written_by(np.zeros(0, np.int64), np.arange(3)).shape == (0,)


def test_written_by_refuses_a_written_set_out_of_order():
    with pytest.raises(ValueError, match="position 2 holds 3 after 5"):
        written_by(np.arange(4), np.array([1, 5, 3]))
    with pytest.raises(ValueError, match="position 1 holds 2 after 2"):
        written_by(np.arange(4), np.array([2, 2]))


def test_interleave_rows_puts_each_pull_back_in_key_order():
    rng = np.random.default_rng(5)
    mask = rng.random(50) < 0.3
    late = rng.random((int(mask.sum()), 3)).astype(np.float32)
    early = rng.random((int((~mask).sum()), 3)).astype(np.float32)
    rows = _ps_client.interleave_rows(mask, late, early)
    np.testing.assert_array_equal(rows[mask], late)
    np.testing.assert_array_equal(rows[~mask], early)
    with pytest.raises(ValueError, match="must hold the"):
        _ps_client.interleave_rows(mask, late[1:], early)
    with pytest.raises(ValueError, match="must hold the"):
        _ps_client.interleave_rows(mask, late, early[:, :2])


def test_fill_rows_takes_each_key_from_the_first_level_that_holds_it():
    """The sole writer's read: the newest held step wins, then the older, then the pull."""
    rng = np.random.default_rng(6)
    keys = np.unique(rng.integers(0, 400, 120))
    newer = np.unique(rng.choice(keys, 40))
    older = np.unique(np.concatenate([rng.choice(keys, 40), rng.integers(400, 500, 9)]))
    rows_of = {k: rng.random(3).astype(np.float32) for k in range(500)}
    level = lambda ks, tag: (ks, np.stack([rows_of[k] + tag for k in ks]))  # noqa: E731
    held = [level(newer, 1.0), level(older, 2.0)]
    rest_keys = keys[~np.isin(keys, np.concatenate([newer, older]))]
    rest = np.stack([rows_of[k] for k in rest_keys])
    got = _ps_client.fill_rows(keys, rest, held)
    want = np.stack(
        [rows_of[k] + (1.0 if k in newer else 2.0 if k in older else 0.0) for k in keys.tolist()]
    )
    np.testing.assert_array_equal(got, want)
    assert _ps_client.fill_rows(keys, np.concatenate([level(keys, 0)[1]]), []).shape == got.shape
    with pytest.raises(ValueError, match=r"must hold the rows of the \d+ keys"):
        _ps_client.fill_rows(keys, rest[1:], held)
    with pytest.raises(ValueError, match="keys must be sorted ascending and distinct"):
        _ps_client.fill_rows(keys[::-1], rest, held)
    with pytest.raises(ValueError, match=r"held\[1\] keys must be sorted"):
        _ps_client.fill_rows(keys, rest, [held[0], (older[::-1], held[1][1])])
    with pytest.raises(ValueError, match=r"held\[0\]: rows \(\d+, 3\) for \d+ keys"):
        _ps_client.fill_rows(keys, rest, [(newer, held[0][1][1:])])
