"""The client's multi-table calls (issue 24 item 2): pull_tables, push_tables, commit_tables
and create_tables against real in-process shards holding several tables of different widths
and optimizers; one RPC per shard per max_keys_per_rpc keys whatever the number of tables;
compression per request; row_steps and row_states per table; errors naming the table."""

from __future__ import annotations

import math
import re
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from cpu_dist.common import contracts
from cpu_dist.sparse import Client, PSError, Server, _ps

from .conftest import TOKEN

pytestmark = pytest.mark.timeout(60)

SEED = 11
# Three tables as a job file declares them: widths 4, 16 and 8, one optimizer each.
SPECS = [
    {"name": "item", "dim": 4, "optimizer": "sgd", "init_scale": 0.5, "seed": SEED},
    {"name": "user", "dim": 16, "optimizer": "rowwise_adagrad", "init_scale": 0.25, "seed": SEED},
    {
        "name": "ad",
        "dim": 8,
        "optimizer": "adagrad",
        "init_scale": 0.125,
        "seed": SEED,
        "eps": 1e-8,
    },
]
BY_NAME = {s["name"]: s for s in SPECS}
PAIRS = [(s["name"], s["dim"]) for s in SPECS]


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.fixture
def shards():
    """A factory of P in-process shards holding `specs` (stopped at the end)."""
    made: list[Server] = []

    def make(num_shards: int, specs=SPECS) -> list[str]:
        servers = [
            Server(0, TOKEN, tables=specs, shard_index=i, num_shards=num_shards)
            for i in range(num_shards)
        ]
        for s in servers:
            s.start()
        made.extend(servers)
        return [s.address for s in servers]

    yield make
    for s in made:
        s.stop(2.0)


def first_touch(name: str, keys) -> np.ndarray:
    s = BY_NAME[name]
    return contracts.row_init(s["seed"], keys, s["dim"], s["init_scale"], table=name)


def shard_calls(client: Client, field: str) -> list[int]:
    return [s[field] for s in client.stats()]


# ---- pulls -------------------------------------------------------------------------------------


def test_pull_tables_gives_each_tables_first_touch_rows(shards):
    addresses = shards(3)
    client = Client(addresses, TOKEN, tables=PAIRS, timeout_s=20.0)
    # Repeated keys inside a table, and the same ids in two tables (two different rows).
    parts = {
        "item": np.array([5, 1, 5, 9, 1, 2**40], np.int64),
        "user": np.array([5, 7], np.int64),
        "ad": np.arange(30, dtype=np.int64),
    }
    got = client.pull_tables(parts)
    assert set(got) == set(parts)
    for name, keys in parts.items():
        assert got[name].shape == (len(keys), BY_NAME[name]["dim"])
        np.testing.assert_array_equal(bits(got[name]), bits(first_touch(name, keys)))
    assert not np.array_equal(got["item"][0, :4], got["user"][0, :4])
    # The one-table form of the same table agrees (it is the same row).
    one = Client(addresses, TOKEN, 16, table="user", timeout_s=20.0)
    np.testing.assert_array_equal(bits(one.pull(parts["user"])), bits(got["user"]))
    # No rows were made by pulls.
    assert sum(s["rows"] for s in client.stats()) == 0


def test_a_pull_of_26_tables_is_one_rpc_per_shard_per_max_keys(shards):
    specs = [
        {"name": f"t{i}", "dim": 4 + 4 * (i % 3), "optimizer": "sgd", "init_scale": 0.5}
        for i in range(26)
    ]
    addresses = shards(2, specs)
    pairs = [(s["name"], s["dim"]) for s in specs]
    rng = np.random.default_rng(0)
    parts = {s["name"]: rng.integers(0, 1 << 40, 20, dtype=np.int64) for s in specs}
    per_shard = np.zeros(2, np.int64)  # keys each shard gets (every table's, salted shard_of)
    for name, keys in parts.items():
        per_shard += np.bincount(contracts.shard_of(keys, 2, table=name), minlength=2)
    model = {
        s["name"]: contracts.row_init(0, parts[s["name"]], s["dim"], 0.5, table=s["name"])
        for s in specs
    }
    for max_keys in (8192, 100):
        client = Client(addresses, TOKEN, tables=pairs, max_keys_per_rpc=max_keys, timeout_s=20.0)
        before = shard_calls(client, "pull_calls")
        rows = client.pull_tables(parts)
        after = shard_calls(client, "pull_calls")
        want = [math.ceil(m / max_keys) for m in per_shard]
        assert [a - b for a, b in zip(after, before)] == want, (max_keys, per_shard)
        for name, w in model.items():
            np.testing.assert_array_equal(bits(rows[name]), bits(w), err_msg=name)
        # A commit step of every table: one chunk per shard per max_keys keys (at least one).
        before = shard_calls(client, "commit_calls")
        update = {
            n: (k, np.full((len(k), dict(pairs)[n]), 0.5, np.float32), 0.1)
            for n, k in parts.items()
        }
        for n, (_, g, lr) in update.items():
            contracts.sparse_update("sgd", model[n], None, g, lr)
        client.commit_tables(max_keys, 0, 0, 1, update)
        after = shard_calls(client, "commit_calls")
        assert [a - b for a, b in zip(after, before)] == [max(1, w) for w in want]
        assert client.wait_committed(max_keys, 0, 10.0) == 0


def test_pull_tables_compression_is_per_request(shards):
    addresses = shards(2)
    client = Client(addresses, TOKEN, tables=PAIRS, timeout_s=20.0)
    parts = {"item": np.arange(10, dtype=np.int64), "user": np.arange(5, 12, dtype=np.int64)}
    exact = client.pull_tables(parts)
    t0 = client.traffic()["bytes_pulled"]
    handle = client.pull_tables_async(parts, compression="int8")
    got = handle.wait(10.0)
    for name in parts:
        want = _ps.decode_rows(_ps.encode_rows(exact[name], "int8"), BY_NAME[name]["dim"], "int8")
        np.testing.assert_array_equal(bits(got[name]), bits(want))
    # Each table's rows crossed the wire at its own width: a key, a scale and dim int8s.
    want_bytes = sum(len(k) * (8 + 4 + BY_NAME[n]["dim"]) for n, k in parts.items())
    assert client.traffic()["bytes_pulled"] - t0 == want_bytes
    # The next pull without compression is float32 again.
    again = client.pull_tables(parts)
    for name in parts:
        np.testing.assert_array_equal(bits(again[name]), bits(exact[name]))


# ---- updates -----------------------------------------------------------------------------------


def model_step(name: str, rows, state, grads, lr):
    """The shard's update of one table's rows by one aggregated gradient step, in numpy."""
    s = BY_NAME[name]
    kw = {"eps": s["eps"]} if s["optimizer"] == "adagrad" else {}
    contracts.sparse_update(s["optimizer"], rows, state, grads, lr, **kw)


def fresh_state(name: str, n: int) -> np.ndarray:
    s = BY_NAME[name]
    shape = (n, s["dim"]) if s["optimizer"] == "adagrad" else (n,)
    return np.zeros(shape, np.float32)


def test_commit_tables_applies_every_table_as_the_numpy_model(shards):
    addresses = shards(2)
    ranks = [Client(addresses, TOKEN, tables=PAIRS, timeout_s=20.0) for _ in range(2)]
    rng = np.random.default_rng(1)
    keys = {"item": np.arange(12, dtype=np.int64), "user": np.arange(3, 9, dtype=np.int64)}
    lrs = {"item": 0.1, "user": 0.05, "ad": 0.2}
    # Each rank's gradients (the same keys on both ranks; "ad" has none this step, named).
    grads = [
        {
            n: rng.standard_normal((len(k), BY_NAME[n]["dim"])).astype(np.float32)
            for n, k in keys.items()
        }
        for _ in range(2)
    ]
    handles = []
    for r, client in enumerate(ranks):
        parts = {n: (keys[n], grads[r][n], lrs[n]) for n in keys}
        parts["ad"] = (np.zeros(0, np.int64), np.zeros((0, 8), np.float32), lrs["ad"])
        handles.append(client.commit_tables_async(3, 0, r, 2, parts))
    for h in handles:
        h.wait(10.0)
    assert ranks[0].wait_committed(3, 0, 10.0) == 0
    # Step 1: rank 0 alone touches "ad", rank 1 sends empty markers for every table.
    ad_keys = np.array([4, 4, 70], np.int64)  # a repeated key is summed before the optimizer
    ad_grads = rng.standard_normal((3, 8)).astype(np.float32)
    empty = {n: (np.zeros(0, np.int64), np.zeros((0, d), np.float32), lrs[n]) for n, d in PAIRS}
    ranks[1].commit_tables(3, 1, 1, 2, empty)
    ranks[0].commit_tables(3, 1, 0, 2, {**empty, "ad": (ad_keys, ad_grads, lrs["ad"])})
    assert ranks[0].wait_committed(3, 1, 10.0) == 1

    want = {}
    for name, k in keys.items():
        rows = first_touch(name, k)
        summed = (grads[0][name] + grads[1][name]) / np.float32(2)
        model_step(name, rows, fresh_state(name, len(k)), summed, lrs[name])
        want[name] = rows
    uk = np.array([4, 70], np.int64)
    ad = first_touch("ad", uk)
    ad_sum = np.stack([ad_grads[0] + ad_grads[1], ad_grads[2]]) / np.float32(2)
    ad_state = fresh_state("ad", 2)
    model_step("ad", ad, ad_state, ad_sum, lrs["ad"])
    want["ad"] = ad
    got = ranks[0].pull_tables({**keys, "ad": uk})
    for name in want:
        np.testing.assert_array_equal(bits(got[name]), bits(want[name]), err_msg=name)
    # Every table's dump holds its rows; an Adagrad table's state is [n, dim].
    dk, dv, ds = ranks[0].dump(table="ad")
    np.testing.assert_array_equal(dk, uk)
    np.testing.assert_array_equal(bits(dv), bits(ad))
    np.testing.assert_array_equal(bits(ds), bits(ad_state))
    pages = list(ranks[0].dump_pages(table="user"))
    assert sum(len(p[0]) for p in pages) == len(keys["user"])
    assert all(p[2].shape == (len(p[0]),) for p in pages)


@pytest.mark.parametrize("world", [1, 2])
def test_a_large_step_over_tables_applies_as_the_numpy_model(shards, world):
    """Enough rows that the shard applies the tables on two threads (tables.cc), over several
    RPCs a rank; one rank's rising keys are laid end to end, two ranks' are summed."""
    addresses = shards(1)
    ranks = [Client(addresses, TOKEN, tables=PAIRS, timeout_s=30.0) for _ in range(world)]
    rng = np.random.default_rng(5)
    keys = {n: np.sort(rng.choice(1 << 40, 9000, replace=False)).astype(np.int64) for n, _ in PAIRS}
    lrs = {"item": 0.1, "user": 0.05, "ad": 0.2}
    grads = [
        {n: rng.standard_normal((len(keys[n]), d)).astype(np.float32) for n, d in PAIRS}
        for _ in range(world)
    ]
    handles = [
        c.commit_tables_async(8, 0, r, world, {n: (keys[n], grads[r][n], lrs[n]) for n in keys})
        for r, c in enumerate(ranks)
    ]
    for h in handles:
        h.wait(30.0)
    assert ranks[0].wait_committed(8, 0, 30.0) == 0
    got = ranks[0].pull_tables(keys)
    for name, k in keys.items():
        want = first_touch(name, k)
        summed = grads[0][name] if world == 1 else (grads[0][name] + grads[1][name]) / np.float32(2)
        state = None if BY_NAME[name]["optimizer"] == "sgd" else fresh_state(name, len(k))
        model_step(name, want, state, summed, lrs[name])
        np.testing.assert_array_equal(bits(got[name]), bits(want), err_msg=name)


def test_push_tables_merges_repeated_keys_per_table(shards):
    addresses = shards(3)
    client = Client(addresses, TOKEN, tables=PAIRS, max_keys_per_rpc=3, timeout_s=20.0)
    keys = np.array([1, 2, 1, 3, 4, 5, 1], np.int64)
    g = np.arange(len(keys) * 4, dtype=np.float32).reshape(-1, 4) / 10
    client.push_tables({"item": (keys, g, 0.5)})
    uk = np.array([1, 2, 3, 4, 5], np.int64)
    sums = np.stack([g[0] + g[2] + g[6], g[1], g[3], g[4], g[5]])
    want = first_touch("item", uk)
    model_step("item", want, None, sums, 0.5)
    np.testing.assert_array_equal(bits(client.pull_tables({"item": uk})["item"]), bits(want))


# ---- row steps and states ----------------------------------------------------------------------


def test_row_steps_and_states_come_per_table(shards):
    addresses = shards(2)
    client = Client(addresses, TOKEN, tables=PAIRS, timeout_s=20.0)
    rng = np.random.default_rng(2)
    touched = {"user": np.array([1, 2, 3], np.int64), "ad": np.array([1, 9], np.int64)}
    parts = {
        n: (k, rng.standard_normal((len(k), BY_NAME[n]["dim"])).astype(np.float32), 0.1)
        for n, k in touched.items()
    }
    parts["item"] = (np.zeros(0, np.int64), np.zeros((0, 4), np.float32), 0.1)
    client.commit_tables(5, 0, 0, 1, parts)
    client.wait_committed(5, 0, 10.0)
    pull = {
        "user": np.array([3, 1, 40, 1], np.int64),
        "ad": np.array([9, 1], np.int64),
        "item": np.array([1], np.int64),
    }
    h = client.pull_tables_async(pull, session=5, row_steps=True, row_states=True)
    rows = h.wait(10.0)
    assert h.committed_step() == 0
    steps, states = h.row_steps(), h.row_states()
    assert set(steps) == set(states) == set(pull)
    np.testing.assert_array_equal(steps["ad"], [0, 0])
    assert steps["user"][0] == steps["user"][1] == steps["user"][3] == 0
    assert states["user"].shape == (4,) and states["ad"].shape == (2, 8)
    assert states["item"].shape == (1,) and states["item"][0] == 0.0
    assert states["user"][2] == 0.0  # key 40 was never updated
    # The states are the optimizers' after the step (the model's).
    for name, order in (("user", [2, 0, 0]), ("ad", [1, 0])):
        k, g, lr = parts[name]
        w = first_touch(name, k)
        st = fresh_state(name, len(k))
        model_step(name, w, st, g, lr)
        idx = {int(key): i for i, key in enumerate(k)}
        got_states = states[name][: len(order)] if name == "ad" else states[name][[0, 1, 3]]
        want_states = st[[idx[int(x)] for x in pull[name] if int(x) in idx]]
        np.testing.assert_array_equal(bits(got_states), bits(want_states))
        np.testing.assert_array_equal(
            bits(rows[name][[i for i, x in enumerate(pull[name]) if int(x) in idx]]),
            bits(w[[idx[int(x)] for x in pull[name] if int(x) in idx]]),
        )


def test_a_one_table_pull_of_an_adagrad_table_gives_its_dim_states(shards):
    addresses = shards(1)
    ad = Client(addresses, TOKEN, 8, table="ad", timeout_s=20.0)
    k = np.array([2, 5], np.int64)
    g = np.arange(16, dtype=np.float32).reshape(2, 8) / 8
    ad.commit(9, 0, 0, 1, k, g, 0.1, "adagrad")
    ad.wait_committed(9, 0, 10.0)
    pull = np.array([5, 2, 5], np.int64)
    h = ad.pull_async(pull, session=9, row_states=True)
    h.wait(10.0)
    w, st = first_touch("ad", k), fresh_state("ad", 2)
    model_step("ad", w, st, g, 0.1)
    np.testing.assert_array_equal(bits(h.row_states()), bits(st[[1, 0, 1]]))


# ---- tables on the shards ----------------------------------------------------------------------


def test_create_tables_is_idempotent_and_refuses_another_spec(shards):
    addresses = shards(2, [SPECS[0]])
    client = Client(addresses, TOKEN, tables=PAIRS, timeout_s=20.0)
    assert client.create_tables(SPECS[1:]) == [{"created": 2, "existing": 0}] * 2
    assert client.create_tables(SPECS) == [{"created": 0, "existing": 3}] * 2
    with pytest.raises(PSError, match=r"'user'.*dim|dim.*'user'"):
        client.create_tables([{**SPECS[1], "dim": 32}])
    with pytest.raises(PSError, match=r"'ad'.*eps|eps.*'ad'"):
        client.create_tables([{**SPECS[2], "eps": 1e-6}])
    with pytest.raises(ValueError, match=r"table 'x'.*unknown key 'width'"):
        client.create_tables(
            [{"name": "x", "dim": 4, "optimizer": "sgd", "init_scale": 1.0, "width": 4}]
        )
    with pytest.raises(ValueError, match=r"table 'x'.*optimizer"):
        client.create_tables([{"name": "x", "dim": 4, "optimizer": "adam", "init_scale": 1.0}])
    # Health lists every table's spec dict, name order; Stats every table's figures.
    for h in client.health():
        specs = h["tables"]
        assert [s["name"] for s in specs] == sorted(BY_NAME)
        for s in specs:
            want = BY_NAME[s["name"]]
            assert s["dim"] == want["dim"] and s["optimizer"] == want["optimizer"]
            assert s["init_scale"] == want["init_scale"] and s["seed"] == SEED
    client.push_tables({"user": (np.arange(6, dtype=np.int64), np.ones((6, 16), np.float32), 0.1)})
    tables = [{t["name"]: t for t in s["tables"]} for s in client.stats()]
    assert sum(t["user"]["rows"] for t in tables) == 6
    assert sum(t["item"]["rows"] for t in tables) == 0
    assert all(
        t["user"]["dim"] == 16 and t["user"]["bytes"] > 0 for t in tables if t["user"]["rows"]
    )


def test_errors_name_the_table(shards):
    addresses = shards(1)
    client = Client(addresses, TOKEN, tables=PAIRS, timeout_s=20.0)
    with pytest.raises(ValueError, match=r"table 'nope' is not one of this client's tables"):
        client.pull_tables({"nope": np.arange(3)})
    with pytest.raises(ValueError, match=r"table 'user'.*shape \(2, 16\)"):
        client.commit_tables(
            1, 0, 0, 1, {"user": (np.arange(2), np.zeros((2, 8), np.float32), 0.1)}
        )
    with pytest.raises(ValueError, match=r"table 'item'.*not finite"):
        client.push_tables({"item": (np.arange(1), np.full((1, 4), np.nan, np.float32), 0.1)})
    with pytest.raises(ValueError, match=r"table 'item'.*lr"):
        client.push_tables({"item": (np.arange(1), np.ones((1, 4), np.float32), 0.0)})
    # The shard refuses a table it lacks, and a width other than the table's, naming it.
    wrong = Client(addresses, TOKEN, tables=[("item", 8), ("other", 4)], timeout_s=20.0)
    with pytest.raises(PSError, match=r"'item'.*dim 8"):
        wrong.pull_tables({"item": np.arange(3)})
    with pytest.raises(PSError, match=r"'other'"):
        wrong.pull_tables({"other": np.arange(3)})
    with pytest.raises(ValueError, match=r"named twice"):
        Client(addresses, TOKEN, tables=[("a", 4), ("a", 8)])
    with pytest.raises(ValueError, match=r"dim 0"):
        Client(addresses, TOKEN, tables=[("a", 0)])
    with pytest.raises(ValueError, match=r"dim 0 with tables"):
        Client(addresses, TOKEN, 8, tables=PAIRS)
    # Nothing was applied by the refused calls.
    assert client.stats()[0]["rows"] == 0


def test_client_tables_and_the_one_table_calls(shards):
    addresses = shards(1)
    client = Client(addresses, TOKEN, tables=PAIRS, table="user", timeout_s=20.0)
    assert client.tables == PAIRS and client.table == "user" and client.dim == 16
    keys = np.arange(4, dtype=np.int64)
    np.testing.assert_array_equal(bits(client.pull(keys)), bits(first_touch("user", keys)))
    first = Client(addresses, TOKEN, tables=PAIRS, timeout_s=20.0)
    assert first.table == "item" and first.dim == 4  # "embedding" is not among them
    assert first.dump()[1].shape == (0, 4)


def test_multi_table_calls_end_by_the_clients_deadline():
    """A shard that accepts connections and never answers: each call fails by timeout_s."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        client = Client(
            [f"127.0.0.1:{silent.getsockname()[1]}"], TOKEN, tables=PAIRS, timeout_s=0.5
        )
        empty = {n: (np.zeros(0, np.int64), np.zeros((0, d), np.float32), 0.1) for n, d in PAIRS}
        for call in (
            lambda: client.pull_tables({"item": np.arange(3)}),
            lambda: client.commit_tables(1, 0, 0, 1, empty),
            lambda: client.push_tables({"item": (np.arange(2), np.ones((2, 4), np.float32), 0.1)}),
        ):
            with pytest.raises(PSError) as err:
                call()
            assert err.value.code == "DEADLINE_EXCEEDED" and err.value.shard == 0
        client.close()


# ---- the client's own extension (issue 24 item 7) ----------------------------------------------


def test_the_client_module_imports_without_the_shards_and_links_no_rocksdb():
    script = textwrap.dedent(
        """
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "cpu_dist.sparse._ps":
                    raise ImportError("the shard's module is blocked in this test")
                return None

        sys.meta_path.insert(0, Block())
        import cpu_dist.sparse
        from cpu_dist.sparse import Client, PSError, TablesHandle, client_defaults
        from cpu_dist.sparse import _ps_client
        c = Client(["127.0.0.1:1"], "t", tables=[("a", 4)], timeout_s=1.0)
        assert c.tables == [("a", 4)] and client_defaults()["max_keys_per_rpc"] > 0
        assert "cpu_dist.sparse._ps" not in sys.modules
        print(_ps_client.__file__)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0, proc.stderr
    client_so = proc.stdout.strip().splitlines()[-1]

    def libraries(path: str) -> str:
        out = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert not re.search(r"rocksdb|isal", libraries(client_so)), libraries(client_so)
    # The shard's module does link them (the check above can fail), and re-exports the client.
    assert re.search(r"rocksdb", libraries(_ps.__file__))
    assert _ps.Client is Client and _ps.PSError is PSError
