"""The one-table and the multi-table calls check their common arguments with one code
(csrc/python/client_args.h): the same refusal, word for word, from either."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_dist.sparse import Client, Server

from .conftest import TOKEN

pytestmark = pytest.mark.timeout(60)

SPEC = {"name": "x", "dim": 4, "optimizer": "sgd", "init_scale": 0.5}


@pytest.fixture(scope="module")
def client():
    server = Server(0, TOKEN, tables=[SPEC])
    server.start()
    c = Client([server.address], TOKEN, tables=[("x", 4)], timeout_s=20.0)
    yield c
    c.close()
    server.stop()


# (commit's arguments after (session, step), the refusal)
COMMITS = [
    ((2, 2), "rank must be in 0..world_size-1, got rank 2 world_size 2"),
    ((0, 0), "rank must be in 0..world_size-1, got rank 0 world_size 0"),
    ((0, 1, {"max_ahead": 0}), "max_ahead must be in 1.."),
    ((0, 1, {"base_step": -1}), "base_step must be >= 0, got -1"),
]


@pytest.mark.parametrize(("args", "why"), COMMITS, ids=[c[1] for c in COMMITS])
def test_commit_and_commit_tables_refuse_alike(client, args, why):
    rank, world, *kw = args
    extra = kw[0] if kw else {}
    k = np.array([1, 2], np.int64)
    g = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError) as one:
        client.commit(1, 0, rank, world, k, g, 0.1, **extra)
    with pytest.raises(ValueError) as many:
        client.commit_tables(1, 0, rank, world, {"x": (k, g, 0.1)}, **extra)
    assert str(one.value) == str(many.value) and why in str(one.value)


def test_pulls_refuse_row_steps_without_a_session_alike(client):
    k = np.array([1, 2], np.int64)
    for call, pull in (
        ("pull_async", lambda **kw: client.pull_async(k, **kw)),
        ("pull_tables", lambda **kw: client.pull_tables_async({"x": k}, **kw)),
    ):
        for flag in ("row_steps", "row_states"):
            with pytest.raises(ValueError) as e:
                pull(**{flag: True})
            assert str(e.value) == f"{call}: row_steps and row_states need a session"


def test_lr_and_optimizer_refusals_name_the_table_in_multi_table_calls(client):
    k = np.array([1, 2], np.int64)
    g = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError) as one:
        client.push(k, g, -1.0)
    with pytest.raises(ValueError) as many:
        client.push_tables({"x": (k, g, -1.0)})
    assert str(many.value) == f"push_tables table 'x': {one.value}"
    with pytest.raises(ValueError) as one:
        client.push(k, g, 0.1, "adam")
    with pytest.raises(ValueError) as many:
        client.push_tables({"x": (k, g, 0.1)}, optimizer="adam")
    assert str(many.value) == str(one.value)
