"""Many tables on a shard (tables issue): tables of different widths and optimizers on 1-3
in-process shards, driven through the raw wire (multi-part Pull/Push/Commit requests built with
grpcio stubs from proto/ps.proto), give per table the rows of a numpy model of the same updates
(contracts.sparse_update); a step over several tables is all or nothing; CreateTables is
idempotent for the same spec and refused naming the field for another."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from cpu_dist.common import contracts
from cpu_dist.sparse import Server
from cpu_dist.sparse._ps import apply_rows
from cpu_dist.sparse.grpc_stubs import token_metadata

from .conftest import TOKEN

pytestmark = pytest.mark.timeout(120)
MD = token_metadata(TOKEN)

SPECS = [
    {"name": "item", "dim": 4, "optimizer": "sgd", "init_scale": 0.5, "seed": 3},
    {"name": "user", "dim": 8, "optimizer": "rowwise_adagrad", "init_scale": 0.25, "seed": 3},
    {
        "name": "wide",
        "dim": 16,
        "optimizer": "adagrad",
        "init_scale": 0.125,
        "seed": 3,
        "eps": 1e-8,
    },
]
LR = {"item": 0.5, "user": 0.1, "wide": 0.05}
OPT = {"sgd": 0, "rowwise_adagrad": 1, "adagrad": 2}


class Shards:
    """P in-process shards holding `specs`, and a raw stub per shard."""

    def __init__(self, pb, num_shards: int, specs=SPECS, **kw):
        self.pb, self.P = pb[0], num_shards
        self.specs = {s["name"]: s for s in specs}
        self.servers = [
            Server(0, TOKEN, tables=specs, shard_index=i, num_shards=num_shards, **kw)
            for i in range(num_shards)
        ]
        for s in self.servers:
            s.start()
        self.channels = [grpc.insecure_channel(s.address) for s in self.servers]
        self.stubs = [pb[1].ParameterServerStub(c) for c in self.channels]

    def close(self):
        for c in self.channels:
            c.close()
        for s in self.servers:
            s.stop(1.0)

    def split(self, parts: dict[str, tuple]):
        """Per shard: the tables' (keys, rows-or-None) owned by it (table's salted shard_of)."""
        out = []
        for p in range(self.P):
            mine = {}
            for name, (keys, rows) in parts.items():
                m = contracts.shard_of(keys, self.P, table=name) == p
                mine[name] = (keys[m], None if rows is None else rows[m])
            out.append(mine)
        return out

    def request_parts(self, mine, lr=None):
        tp, keys, grads = [], [], []
        for name, (k, g) in mine.items():
            part = self.pb.TablePart(table=name.encode(), dim=self.specs[name]["dim"], count=len(k))
            if lr is not None:
                part.lr = lr[name]
            tp.append(part)
            keys.append(np.asarray(k, np.int64).tobytes())
            if g is not None:
                grads.append(np.asarray(g, np.float32).tobytes())
        return tp, b"".join(keys), b"".join(grads)

    def pull(self, parts: dict[str, np.ndarray], states=False):
        """Rows (and states) of every table's keys, from every shard in one request each."""
        rows = {n: np.zeros((len(k), self.specs[n]["dim"]), np.float32) for n, k in parts.items()}
        st = {n: np.zeros((len(k), self.state_floats(n)), np.float32) for n, k in parts.items()}
        masks = {n: contracts.shard_of(k, self.P, table=n) for n, k in parts.items()}
        for p, mine in enumerate(self.split({n: (k, None) for n, k in parts.items()})):
            tp, kb, _ = self.request_parts(mine)
            r = self.stubs[p].Pull(
                self.pb.PullRequest(keys=kb, parts=tp, row_states=states), metadata=MD, timeout=30
            )
            vals = np.frombuffer(r.values, np.float32)
            sts = np.frombuffer(r.row_states, np.float32)
            v_at = s_at = 0
            for name, (k, _) in mine.items():
                d, sw = self.specs[name]["dim"], self.state_floats(name)
                rows[name][masks[name] == p] = vals[v_at : v_at + len(k) * d].reshape(-1, d)
                v_at += len(k) * d
                if states:
                    st[name][masks[name] == p] = sts[s_at : s_at + len(k) * sw].reshape(-1, sw)
                    s_at += len(k) * sw
            assert v_at == len(vals)
        return (rows, st) if states else rows

    def state_floats(self, name):
        s = self.specs[name]
        return contracts.state_floats(s["optimizer"], s["dim"])

    def commit(self, session, step, rank, world, parts, lr=LR):
        """One rank's step: one chunk per shard naming every table (empty where it has none)."""
        for p, mine in enumerate(self.split(parts)):
            tp, kb, gb = self.request_parts(mine, lr)
            self.stubs[p].Commit(
                self.pb.CommitRequest(
                    session=session,
                    step=step,
                    rank=rank,
                    world_size=world,
                    chunk_index=0,
                    chunk_count=1,
                    keys=kb,
                    grads=gb,
                    parts=tp,
                ),
                metadata=MD,
                timeout=30,
            )


class Model:
    """The numpy twin of the shards: per table, rows from row_init, updated per committed step
    with contracts.sparse_update on the rank-ordered sums / world size."""

    def __init__(self, specs):
        self.specs = {s["name"]: s for s in specs}
        self.rows: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]] = {n: {} for n in self.specs}

    def row(self, name, key):
        s = self.specs[name]
        if key not in self.rows[name]:
            r = contracts.row_init(s["seed"], [key], s["dim"], s["init_scale"], table=name)[0]
            self.rows[name][key] = (
                r.copy(),
                np.zeros(contracts.state_floats(s["optimizer"], s["dim"]), np.float32),
            )
        return self.rows[name][key]

    def step(self, per_rank: list[dict[str, tuple]], lr=LR):
        world = np.float32(len(per_rank))
        for name, s in self.specs.items():
            sums: dict[int, np.ndarray] = {}
            for parts in per_rank:  # rank order, then the rank's keys in order
                keys, grads = parts[name]
                for k, g in zip(keys.tolist(), grads):
                    sums[k] = g.copy() if k not in sums else sums[k] + g
            for k, g in sums.items():
                w, st = self.row(name, k)
                w2, g2 = w[None, :], (g / world)[None, :]
                st2 = st[None, :] if s["optimizer"] == "adagrad" else st
                contracts.sparse_update(
                    s["optimizer"], w2, st2, g2, lr[name], s.get("eps", contracts.ADAGRAD_EPS)
                )

    def expect(self, name, keys):
        return np.stack([self.row(name, k)[0] for k in keys.tolist()])

    def expect_state(self, name, keys):
        return np.stack([self.row(name, k)[1] for k in keys.tolist()])


@pytest.fixture
def shards(pb):
    made = []

    def make(num_shards, **kw):
        s = Shards(pb, num_shards, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def rank_parts(rng, step, rank):
    """A rank's step: per table, unique keys (some shared across ranks and tables)."""
    out = {}
    for spec in SPECS:
        keys = rng.choice(40, size=int(rng.integers(0, 12)), replace=False).astype(np.int64)
        out[spec["name"]] = (keys, rng.standard_normal((len(keys), spec["dim"])).astype(np.float32))
    return out


@pytest.mark.parametrize("num_shards", [1, 3])
def test_tables_of_three_widths_and_optimizers_follow_the_numpy_model(shards, num_shards):
    s = shards(num_shards)
    model = Model(SPECS)
    rng = np.random.default_rng(num_shards)
    world = 2
    all_keys = {spec["name"]: np.arange(40, dtype=np.int64) for spec in SPECS}
    for step in range(4):
        per_rank = [rank_parts(rng, step, r) for r in range(world)]
        for r in (1, 0):  # arrival order is not the summing order
            s.commit(9, step, r, world, per_rank[r])
        model.step(per_rank)
        # A pull after the step (the shard answers each Commit chunk at once; the last rank's
        # chunk applied the step before its reply) holds it, every table.
        rows, states = s.pull(all_keys, states=True)
        for name, keys in all_keys.items():
            np.testing.assert_array_equal(rows[name], model.expect(name, keys), err_msg=name)
            np.testing.assert_array_equal(
                states[name], model.expect_state(name, keys), err_msg=name
            )


def test_key_k_of_two_tables_is_two_rows(shards):
    specs = [
        {"name": "a", "dim": 4, "optimizer": "sgd", "init_scale": 1.0, "seed": 5},
        {"name": "b", "dim": 4, "optimizer": "sgd", "init_scale": 1.0, "seed": 5},
        {"name": "embedding", "dim": 4, "optimizer": "sgd", "init_scale": 1.0, "seed": 5},
    ]
    s = shards(2, specs=specs)
    keys = np.arange(10, dtype=np.int64)
    rows = s.pull({"a": keys, "b": keys, "embedding": keys})
    for name in ("a", "b", "embedding"):
        np.testing.assert_array_equal(rows[name], contracts.row_init(5, keys, 4, 1.0, table=name))
    assert not np.array_equal(rows["a"], rows["b"])
    # The default table's rows are today's (unsalted) ones.
    np.testing.assert_array_equal(rows["embedding"], contracts.row_init(5, keys, 4, 1.0))
    # A push to a's key 3 leaves b's key 3 alone.
    tp, kb, gb = s.request_parts({"a": (np.array([3]), np.ones((1, 4), np.float32))}, {"a": 1.0})
    p = int(contracts.shard_of(np.array([3]), 2, table="a")[0])
    s.stubs[p].Push(s.pb.PushRequest(keys=kb, grads=gb, parts=tp), metadata=MD, timeout=30)
    after = s.pull({"a": keys, "b": keys})
    np.testing.assert_array_equal(after["a"][3], rows["a"][3] - 1.0)
    np.testing.assert_array_equal(after["b"], rows["b"])


def spec_msg(pb, **kw):
    base = {"name": b"t", "dim": 4, "optimizer": 0, "init_scale": 0.5, "seed": 1}
    base.update(kw)
    return pb.TableSpec(**base)


def test_create_tables_is_idempotent_and_refuses_another_spec_naming_the_field(shards):
    s = shards(1, specs=SPECS[:1])
    pb, stub = s.pb, s.stubs[0]
    r = stub.CreateTables(pb.CreateTablesRequest(tables=[spec_msg(pb)]), metadata=MD, timeout=30)
    assert (r.created, r.existing) == (1, 0)
    r = stub.CreateTables(pb.CreateTablesRequest(tables=[spec_msg(pb)]), metadata=MD, timeout=30)
    assert (r.created, r.existing) == (0, 1)
    for field, value in [
        ("dim", 8),
        ("optimizer", 1),
        ("init_scale", 0.25),
        ("seed", 2),
        ("admit_after", 3),
    ]:
        with pytest.raises(grpc.RpcError) as ei:
            stub.CreateTables(
                pb.CreateTablesRequest(
                    tables=[spec_msg(pb, name=b"new"), spec_msg(pb, **{field: value})]
                ),
                metadata=MD,
                timeout=30,
            )
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"table 't' exists on this shard with another {field}" in ei.value.details()
    # Refused whole: the other table of the refused requests was not made.
    health = stub.Health(pb.HealthRequest(), metadata=MD, timeout=30)
    assert [t.name for t in health.tables] == [b"item", b"t"]
    with pytest.raises(grpc.RpcError) as ei:
        stub.CreateTables(
            pb.CreateTablesRequest(tables=[spec_msg(pb, name=b"x", optimizer=2)]),
            metadata=MD,
            timeout=30,
        )
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "table 'x': eps must be finite and > 0 for adagrad" in ei.value.details()


def test_a_step_with_one_bad_part_changes_no_table(shards):
    s = shards(1)
    keys = {n: np.arange(6, dtype=np.int64) for n in LR}
    before = s.pull(keys, states=True)
    good = {
        spec["name"]: (keys[spec["name"]], np.ones((6, spec["dim"]), np.float32)) for spec in SPECS
    }
    bad = dict(good)
    g = np.ones((6, 16), np.float32)
    g[2, 3] = np.nan
    bad["wide"] = (keys["wide"], g)
    with pytest.raises(grpc.RpcError) as ei:
        s.commit(1, 0, 0, 1, bad)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "table 'wide' key 2 column 3 is nan" in ei.value.details()
    # Rank 1 names another lr for one table than rank 0's chunk of the same step: refused.
    s.commit(2, 0, 0, 2, good)
    with pytest.raises(grpc.RpcError) as ei:
        s.commit(2, 0, 1, 2, good, lr={**LR, "user": 0.2})
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "differ from the tables" in ei.value.details()
    # An unknown table or a wrong dim in one part: refused naming it.
    tp, kb, gb = s.request_parts({"item": (keys["item"], np.ones((6, 4), np.float32))}, LR)
    tp.append(s.pb.TablePart(table=b"nope", dim=4, count=0, lr=0.1))
    with pytest.raises(grpc.RpcError) as ei:
        s.stubs[0].Push(s.pb.PushRequest(keys=kb, grads=gb, parts=tp), metadata=MD, timeout=30)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown table 'nope'" in ei.value.details()
    tp[1] = s.pb.TablePart(table=b"user", dim=4, count=0, lr=0.1)
    with pytest.raises(grpc.RpcError) as ei:
        s.stubs[0].Push(s.pb.PushRequest(keys=kb, grads=gb, parts=tp), metadata=MD, timeout=30)
    assert "table 'user': dim 4 does not match the table's dim 8" in ei.value.details()
    after = s.pull(keys, states=True)
    for name in LR:
        np.testing.assert_array_equal(after[0][name], before[0][name])
        np.testing.assert_array_equal(after[1][name], before[1][name])


def test_a_request_naming_another_optimizer_than_the_table_is_refused(shards, cluster_factory):
    s = shards(1)
    k = np.arange(2, dtype=np.int64).tobytes()
    with pytest.raises(grpc.RpcError) as ei:
        s.stubs[0].Push(
            s.pb.PushRequest(
                table=b"user",
                dim=8,
                keys=k,
                grads=np.ones((2, 8), np.float32).tobytes(),
                lr=0.1,
                optimizer=2,
            ),
            metadata=MD,
            timeout=30,
        )
    assert "optimizer adagrad for table 'user', whose optimizer is rowwise_adagrad" in (
        ei.value.details()
    )
    # The one-table form against a table with a spec runs the spec's optimizer.
    s.stubs[0].Push(
        s.pb.PushRequest(
            table=b"wide", dim=16, keys=k, grads=np.ones((2, 16), np.float32).tobytes(), lr=0.1
        ),
        metadata=MD,
        timeout=30,
    )
    _, states = s.pull({"wide": np.arange(2, dtype=np.int64)}, states=True)
    np.testing.assert_array_equal(states["wide"], np.ones((2, 16), np.float32))
    # A flag-declared table serves sgd and rowwise_adagrad per request, not adagrad.
    c = cluster_factory(num_shards=1, dim=4)
    ch = grpc.insecure_channel(c.addresses[0])
    flag = type(s.stubs[0])(ch)
    with pytest.raises(grpc.RpcError) as ei:
        flag.Push(
            s.pb.PushRequest(
                table=b"embedding",
                dim=4,
                keys=k,
                grads=np.ones((2, 4), np.float32).tobytes(),
                lr=0.1,
                optimizer=2,
            ),
            metadata=MD,
            timeout=30,
        )
    assert "declared by the shard's flags" in ei.value.details()
    ch.close()


def test_stats_health_and_dump_per_table(shards):
    s = shards(1)
    pb, stub = s.pb, s.stubs[0]
    parts = {
        spec["name"]: (np.arange(3 + i, dtype=np.int64), np.ones((3 + i, spec["dim"]), np.float32))
        for i, spec in enumerate(SPECS)
    }
    s.commit(4, 0, 0, 1, parts)
    st = stub.Stats(pb.StatsRequest(), metadata=MD, timeout=30)
    assert [(t.name, t.dim, t.rows) for t in st.tables] == [
        (b"item", 4, 3),
        (b"user", 8, 4),
        (b"wide", 16, 5),
    ]
    assert st.rows == 12 and st.table_bytes == sum(t.bytes for t in st.tables)
    h = stub.Health(pb.HealthRequest(), metadata=MD, timeout=30)
    assert [(t.name, t.dim, t.optimizer) for t in h.tables] == [
        (b"item", 4, 0),
        (b"user", 8, 1),
        (b"wide", 16, 2),
    ]
    assert (h.table, h.dim, h.rows) == (b"item", 4, 12)  # the first table's, the total rows
    assert h.tables[2].eps == np.float32(1e-8)
    d = stub.Dump(pb.DumpRequest(table=b"wide"), metadata=MD, timeout=30)
    keys = np.frombuffer(d.keys, np.int64)
    np.testing.assert_array_equal(keys, np.arange(5))
    state = np.frombuffer(d.state, np.float32).reshape(5, 16)  # Adagrad: dim floats a row
    np.testing.assert_array_equal(state, np.ones((5, 16), np.float32))
    rows = np.frombuffer(d.values, np.float32).reshape(5, 16)
    np.testing.assert_array_equal(rows, s.pull({"wide": keys})["wide"])
    with pytest.raises(grpc.RpcError) as ei:
        stub.Dump(pb.DumpRequest(table=b"nope"), metadata=MD, timeout=30)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown table 'nope'" in ei.value.details()


def test_adagrad_apply_rows_is_the_numpy_twin_bit_for_bit():
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((5, 7)).astype(np.float32)
    states = np.abs(rng.standard_normal((5, 7))).astype(np.float32)
    sums = rng.standard_normal((5, 7)).astype(np.float32)
    w, s = rows.copy(), states.copy()
    apply_rows(rows, sums, 0.05, "adagrad", divisor=3.0, states=states, eps=1e-6)
    contracts.sparse_update("adagrad", w, s, sums / np.float32(3.0), 0.05, eps=1e-6)
    np.testing.assert_array_equal(rows, w)
    np.testing.assert_array_equal(states, s)
    with pytest.raises(ValueError, match=r"adagrad's states must be float32 \[n, dim\]"):
        apply_rows(rows, sums, 0.05, "adagrad", states=np.zeros(5, np.float32))


def test_server_refuses_bad_table_specs():
    with pytest.raises(ValueError, match="table 'x': unknown key 'lr'"):
        Server(0, TOKEN, tables=[{**SPECS[0], "name": "x", "lr": 0.1}])
    with pytest.raises(ValueError, match="table 'x': optimizer must be"):
        Server(0, TOKEN, tables=[{**SPECS[0], "name": "x", "optimizer": "adam"}])
    with pytest.raises(ValueError, match="give one or the other"):
        Server(4, TOKEN, init_scale=0.1, tables=SPECS)
    with pytest.raises(ValueError, match="listed twice"):
        Server(0, TOKEN, tables=[SPECS[0], SPECS[0]])


def test_a_flag_declared_table_matches_the_specs_it_can_serve(cluster_factory, pb):
    c = cluster_factory(num_shards=1, dim=4, init_scale=0.5, seed=1, memory_rows=100)
    ch = grpc.insecure_channel(c.addresses[0])
    stub = pb[1].ParameterServerStub(ch)
    same = [spec_msg(pb[0], name=b"embedding", optimizer=o) for o in (0, 1)]
    r = stub.CreateTables(pb[0].CreateTablesRequest(tables=same[1:]), metadata=MD, timeout=30)
    assert (r.created, r.existing) == (0, 1)  # rowwise_adagrad (or sgd) per request, as before
    with pytest.raises(grpc.RpcError) as ei:
        stub.CreateTables(
            pb[0].CreateTablesRequest(
                tables=[spec_msg(pb[0], name=b"embedding", optimizer=2, eps=1e-8)]
            ),
            metadata=MD,
            timeout=30,
        )
    assert "table 'embedding' exists on this shard with another optimizer" in ei.value.details()
    assert "declared by the shard's flags" in ei.value.details()
    # A rows budget counts rows of one width: a second table is refused, naming the byte budget.
    with pytest.raises(grpc.RpcError) as ei:
        stub.CreateTables(
            pb[0].CreateTablesRequest(tables=[spec_msg(pb[0])]), metadata=MD, timeout=30
        )
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "memory_rows (--ps-memory-rows) counts rows of one width" in ei.value.details()
    ch.close()


def test_expiry_runs_per_table_on_every_job_step(shards):
    specs = [
        {
            "name": "a",
            "dim": 4,
            "optimizer": "sgd",
            "init_scale": 0.5,
            "seed": 1,
            "expire_after": 2,
        },
        {
            "name": "b",
            "dim": 8,
            "optimizer": "sgd",
            "init_scale": 0.5,
            "seed": 1,
            "expire_after": 2,
        },
    ]
    s = shards(1, specs=specs)
    lr = {"a": 1.0, "b": 1.0}
    one = {"a": np.array([1], np.int64), "b": np.array([1], np.int64)}
    none = {"a": np.array([], np.int64), "b": np.array([], np.int64)}
    rows = {n: np.ones((len(k), s.specs[n]["dim"]), np.float32) for n, k in one.items()}
    s.commit(5, 0, 0, 1, {n: (one[n], rows[n]) for n in one}, lr=lr)
    # Step 1 touches only b: a's row, last updated at step 0, expires at step 2 like b's would.
    s.commit(
        5,
        1,
        0,
        1,
        {"a": (none["a"], np.zeros((0, 4), np.float32)), "b": (one["b"], rows["b"])},
        lr=lr,
    )
    st = s.stubs[0].Stats(s.pb.StatsRequest(), metadata=MD, timeout=30)
    assert [(t.name, t.rows) for t in st.tables] == [(b"a", 1), (b"b", 1)]
    s.commit(
        5,
        2,
        0,
        1,
        {n: (none[n], np.zeros((0, s.specs[n]["dim"]), np.float32)) for n in none},
        lr=lr,
    )
    st = s.stubs[0].Stats(s.pb.StatsRequest(), metadata=MD, timeout=30)
    assert [(t.name, t.rows, t.rows_expired) for t in st.tables] == [(b"a", 0, 1), (b"b", 1, 0)]
    back = s.pull(one)
    np.testing.assert_array_equal(back["a"], contracts.row_init(1, [1], 4, 0.5, table="a"))


@pytest.mark.parametrize("rows_b", [5000, 20000])
def test_a_step_one_table_cannot_take_changes_no_table(shards, rows_b):
    """Table 'b' runs out of slots (one block a stripe: 64 rows) in the step's first pass, after
    table 'a' (name order: first) made its rows resident: neither table takes the step.  At
    20000 rows the tables' passes run on two threads (tables.cc): 'a' is cancelled all the
    same."""
    specs = [
        {"name": "a", "dim": 4, "optimizer": "sgd", "init_scale": 0.5, "seed": 1},
        {"name": "b", "dim": 4, "optimizer": "sgd", "init_scale": 0.5, "seed": 1},
    ]
    s = shards(1, specs=specs, max_blocks_per_stripe=1)
    lr = {"a": 1.0, "b": 1.0}
    ka, kb = np.arange(5, dtype=np.int64), np.arange(rows_b, dtype=np.int64)
    parts = {"a": (ka, np.ones((5, 4), np.float32)), "b": (kb, np.ones((rows_b, 4), np.float32))}
    with pytest.raises(grpc.RpcError) as ei:
        s.commit(6, 0, 0, 1, parts, lr=lr)
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "was not applied" in ei.value.details()
    st = s.stubs[0].Stats(s.pb.StatsRequest(), metadata=MD, timeout=30)
    assert [(t.name, t.rows) for t in st.tables] == [(b"a", 0), (b"b", 0)]
    rows = s.pull({"a": ka})
    np.testing.assert_array_equal(rows["a"], contracts.row_init(1, ka, 4, 0.5, table="a"))
    # A step both tables can take still applies, in a new session.
    s.commit(7, 0, 0, 1, {"a": parts["a"], "b": (kb[:5], np.ones((5, 4), np.float32))}, lr=lr)
    rows = s.pull({"a": ka})
    np.testing.assert_array_equal(rows["a"], contracts.row_init(1, ka, 4, 0.5, table="a") - 1.0)
