"""The binding's refusals, each from one code: a table spec dict is read once
(csrc/python/spec_dict.h) for the shard's Server(tables=...) and the client's create_tables,
and the one-table and multi-table calls check their common arguments once
(csrc/python/client_args.h): the same refusal, word for word, from either side; the
multi-table push/commit refusals name the call and the table."""

from __future__ import annotations

import re

import numpy as np
import pytest

from cpu_dist.sparse import Client, Server

from .conftest import TOKEN

pytestmark = pytest.mark.timeout(60)

GOOD = {"name": "x", "dim": 4, "optimizer": "sgd", "init_scale": 0.5}
U32, U64 = 2**32 - 1, 2**64 - 1


def without(key: str) -> dict:
    return {k: v for k, v in GOOD.items() if k != key}


# (spec, who it names: True for "table 'x'", False for the list entry, the reason)
BAD = [
    ({**GOOD, "width": 4}, True, "unknown key 'width'"),
    (without("dim"), True, "missing key 'dim'"),
    (without("optimizer"), True, "missing key 'optimizer'"),
    (without("init_scale"), True, "missing key 'init_scale'"),
    ({**GOOD, "dim": None}, True, "missing key 'dim'"),
    (without("name"), False, "missing key 'name'"),
    ({**GOOD, "name": 3}, False, "key 'name' has the wrong type (int)"),
    ({**GOOD, "dim": "4"}, True, "key 'dim' has the wrong type (str)"),
    ({**GOOD, "dim": 4.0}, True, "key 'dim' has the wrong type (float)"),
    ({**GOOD, "init_scale": "big"}, True, "key 'init_scale' has the wrong type (str)"),
    ({**GOOD, "optimizer": 1}, True, "key 'optimizer' has the wrong type (int)"),
    ({**GOOD, "dim": 0}, True, f"dim must be in 1..{U32}, got 0"),
    ({**GOOD, "dim": -1}, True, f"dim must be in 1..{U32}, got -1"),
    ({**GOOD, "seed": -1}, True, f"seed must be in 0..{U64}, got -1"),
    ({**GOOD, "num_embeddings": 2**64}, True, f"num_embeddings must be in 0..{U64}, got {2**64}"),
    ({**GOOD, "admit_after": 2**32}, True, f"admit_after must be in 0..{U32}, got {2**32}"),
    ({**GOOD, "expire_after": -3}, True, f"expire_after must be in 0..{U32}, got -3"),
    (
        {**GOOD, "optimizer": "adam"},
        True,
        "optimizer must be 'sgd', 'rowwise_adagrad' or 'adagrad', got 'adam'",
    ),
]


@pytest.fixture(scope="module")
def client():
    server = Server(0, TOKEN, tables=[GOOD])
    server.start()
    c = Client([server.address], TOKEN, tables=[("x", 4)], timeout_s=20.0)
    yield c
    c.close()
    server.stop()


@pytest.mark.parametrize(("spec", "named", "why"), BAD, ids=[b[2] for b in BAD])
def test_server_and_client_refuse_a_bad_spec_dict_alike(client, spec, named, why):
    table = "table 'x'"
    with pytest.raises(ValueError) as server_err:
        Server(0, TOKEN, tables=[GOOD, spec])
    assert str(server_err.value) == f"{table if named else 'tables[1]'}: {why}"
    with pytest.raises(ValueError) as client_err:
        client.create_tables([GOOD, spec])
    assert str(client_err.value) == f"create_tables: {table if named else 'specs[1]'}: {why}"


@pytest.mark.parametrize("spec", [[1], "x"])
def test_a_spec_that_is_no_dict_is_a_type_error_naming_its_place(client, spec):
    with pytest.raises(TypeError, match=re.escape("tables[0] must be a spec dict, got")):
        Server(0, TOKEN, tables=[spec])
    with pytest.raises(TypeError, match=re.escape("create_tables: specs[0] must be a spec dict")):
        client.create_tables([spec])


def test_a_good_spec_reads_alike_on_both_sides(client):
    """Defaults where left out: seed, num_embeddings, admit_after, expire_after 0; eps 1e-8
    for Adagrad, 0 for the others (given or not); None is as left out; numpy integers are
    integers."""
    spec = {**GOOD, "name": "y", "optimizer": "adagrad", "seed": None, "dim": np.int64(4)}
    server = Server(0, TOKEN, tables=[spec, {**GOOD, "eps": 0.5}])
    server.start()
    try:
        c = Client([server.address], TOKEN, tables=[("x", 4)], timeout_s=20.0)
        assert c.create_tables([spec, {**GOOD, "eps": 0.5}]) == [{"created": 0, "existing": 2}]
        (health,) = c.health()
        by_name = {t["name"]: t for t in health["tables"]}
        assert by_name["y"]["eps"] == pytest.approx(1e-8) and by_name["x"]["eps"] == 0.0
        assert by_name["y"]["seed"] == 0 and by_name["y"]["admit_after"] == 0
        c.close()
    finally:
        server.stop()


def test_multi_table_updates_name_the_call_and_the_table_they_refuse():
    specs = [GOOD, {**GOOD, "name": "y", "dim": 3}]
    server = Server(0, TOKEN, tables=specs)
    server.start()
    try:
        c = Client(
            [server.address],
            TOKEN,
            tables=[("x", 4), ("y", 3)],
            compression="fp16",
            timeout_s=20.0,
        )
        k = np.array([5, 6], np.int64)
        g = np.ones((2, 3), np.float32)
        g[1, 2] = 2e38
        ok = (k, np.ones((2, 4), np.float32), 0.1)
        with pytest.raises(ValueError, match=r"key 6 in push of table 'y' \(row 1\): column 2"):
            c.push_tables({"x": ok, "y": (k, g, 0.1)})
        msg = r"key 6 in commit of session 1 step 0 rank 0 table 'y' \(row 1\): column 2"
        with pytest.raises(ValueError, match=msg):
            c.commit_tables(1, 0, 0, 1, {"x": ok, "y": (k, g, 0.1)})
        assert c.traffic()["keys_pushed"] == 0
        c.close()
    finally:
        server.stop()


# ---- the calls' common arguments (client_args.h) ----------------------------------------------

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


@pytest.mark.parametrize("size", [0, 2**31])
def test_server_and_client_refuse_a_bad_max_message_bytes_alike(size):
    with pytest.raises(ValueError) as server_err:
        Server(4, TOKEN, init_scale=0.1, max_message_bytes=size)
    with pytest.raises(ValueError) as client_err:
        Client(["127.0.0.1:1"], TOKEN, 4, max_message_bytes=size)
    assert str(server_err.value) == str(client_err.value)
    assert str(client_err.value).startswith(f"max_message_bytes must be in 1..2^31-1, got {size}")
