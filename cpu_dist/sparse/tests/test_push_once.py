"""A push is applied exactly once (issue 48 item 1).  A push to several tables that meets a
lock at one of them (a commit applying that table) is tried again on a thread that may wait;
before, the tables before the locked one had taken the push already and took it a second time
on the retry.  Now every table's lock is taken, in name order, before any table changes."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cpu_dist.common import contracts
from cpu_dist.sparse import Client, Server

from .conftest import TOKEN

pytestmark = pytest.mark.timeout(120)

SEED = 5
DIM = 4
SPECS = [{"name": n, "dim": DIM, "optimizer": "sgd", "init_scale": 0.5, "seed": SEED} for n in "ab"]
PAIRS = [(s["name"], DIM) for s in SPECS]
LR = 0.5
STEP = 0.0625  # LR * 0.125: every row moves by an exact binary fraction per update


def bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def first_touch(name: str, keys: np.ndarray) -> np.ndarray:
    return contracts.row_init(SEED, keys, DIM, 0.5, table=name)


def pushed(name: str, keys: np.ndarray, times: int) -> np.ndarray:
    """The rows after `times` SGD updates of gradient 0.125 at lr LR, in float32 as the shard."""
    rows = first_touch(name, keys).astype(np.float32)
    for _ in range(times):
        rows = (rows - np.float32(STEP)).astype(np.float32)
    return rows


@pytest.fixture
def shard():
    s = Server(0, TOKEN, tables=SPECS, test_hooks=True)
    s.start()
    yield s
    s.stop(2.0)


def test_a_push_deferred_at_its_second_table_changes_no_table_before_its_retry(shard):
    client = Client([shard.address], TOKEN, tables=PAIRS, timeout_s=30.0)
    keys = np.arange(16, dtype=np.int64)
    g = np.full((len(keys), DIM), 0.125, np.float32)
    # A commit of table b holds b's step lock (and no other) at the pause point.
    shard.test_hold("step_locked")
    shard.test_hold("retry_deferred")
    commit = client.commit_tables_async(1, 0, 0, 1, {"b": (keys, g, LR)})
    push = None
    try:
        assert shard.test_wait_held("step_locked", 20)
        push = client.push_tables_async({"a": (keys, g, LR), "b": (keys, g, LR)})
        # The push met b's lock and waits to run again: table a is as it was.
        assert shard.test_wait_held("retry_deferred", 20)
        rows = client.pull_tables({"a": keys})["a"]
        np.testing.assert_array_equal(bits(rows), bits(first_touch("a", keys)))
    finally:
        shard.test_release("retry_deferred")
        shard.test_release("step_locked")
    commit.wait(30)
    assert push is not None
    push.wait(30)
    got = client.pull_tables({"a": keys, "b": keys})
    np.testing.assert_array_equal(bits(got["a"]), bits(pushed("a", keys, 1)))
    np.testing.assert_array_equal(bits(got["b"]), bits(pushed("b", keys, 2)))  # commit + push


def test_pushes_racing_large_commits_of_one_table_are_each_counted_once(shard):
    """Many two-table pushes against many commits of table b alone, from two threads: every
    push lands once in a, whatever the interleaving (the race the issue reproduced)."""
    client = Client([shard.address], TOKEN, tables=PAIRS, timeout_s=60.0)
    hot = np.arange(8, dtype=np.int64)
    big = np.arange(60_000, dtype=np.int64)  # a commit that holds b's lock a while
    g_hot = np.full((len(hot), DIM), 0.125, np.float32)
    g_big = np.full((len(big), DIM), 0.125, np.float32)
    pushes, commits = 400, 12
    errors: list[BaseException] = []

    def committer() -> None:
        try:
            for step in range(commits):
                client.commit_tables(1, step, 0, 1, {"b": (big, g_big, LR)})
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    t = threading.Thread(target=committer)
    t.start()
    handles = [
        client.push_tables_async({"a": (hot, g_hot, LR), "b": (hot, g_hot, LR)})
        for _ in range(pushes)
    ]
    for h in handles:
        h.wait(60)
    t.join(60)
    assert not t.is_alive() and not errors, errors
    got = client.pull_tables({"a": hot, "b": hot})
    np.testing.assert_array_equal(bits(got["a"]), bits(pushed("a", hot, pushes)))
    np.testing.assert_array_equal(bits(got["b"]), bits(pushed("b", hot, pushes + commits)))
