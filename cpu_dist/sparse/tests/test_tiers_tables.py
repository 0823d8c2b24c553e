"""The DRAM budget of a shard in bytes, shared by its tables (csrc/memory_budget.h): tables of
different widths and optimizers under a tiny byte budget give the bits of all-DRAM shards for
every push, commit, pull and dump; the budget holds over all tables together, one table's
growth evicts another's rows, and the budget options a shard cannot serve are refused."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cpu_dist.common.tables import TableConfig
from cpu_dist.sparse import Client, PSError, Server
from cpu_dist.sparse.server import make_server, parse_args

from .conftest import TOKEN, rng_grads

pytestmark = pytest.mark.timeout(180)
KEYS = 2000  # key space of each table


def spec(name: str, dim: int, optimizer: str) -> dict:
    """A shard's spec dict, made where the job makes its own (TableConfig.spec)."""
    return TableConfig(name, dim, (), optimizer=optimizer, init_scale=0.1).spec(seed=7)


SPECS = [spec("narrow", 4, "sgd"), spec("mid", 16, "rowwise_adagrad"), spec("wide", 64, "adagrad")]
DIMS = {s["name"]: s["dim"] for s in SPECS}
OPT = {s["name"]: s["optimizer"] for s in SPECS}


def state_floats(name: str) -> int:
    return DIMS[name] if OPT[name] == "adagrad" else 1


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


class Shards:
    """num_shards in-process shards holding SPECS (plus the budget keywords)."""

    def __init__(self, num_shards: int, specs=SPECS, **kw):
        self.specs = specs
        self.servers = [
            Server(0, TOKEN, shard_index=i, num_shards=num_shards, tables=specs, **kw)
            for i in range(num_shards)
        ]
        for s in self.servers:
            s.start()

    def client(self) -> Client:
        return Client(
            [s.address for s in self.servers],
            TOKEN,
            0,
            tables=[(s["name"], s["dim"]) for s in self.specs],
            timeout_s=20.0,
        )

    def table_stats(self) -> list[dict[str, dict]]:
        return [{t["name"]: t for t in srv.stats()["tables"]} for srv in self.servers]

    def stop(self):
        for s in self.servers:
            s.stop(2.0)


@pytest.fixture
def shards():
    made: list[Shards] = []

    def make(num_shards: int = 1, **kw) -> Shards:
        made.append(Shards(num_shards, **kw))
        return made[-1]

    yield make
    for m in made:
        m.stop()


def workload(clusters: list[Shards], names, seed: int = 0, steps: int = 5, session: int = 3):
    """The same pushes, two-rank commits of every table and pulls into every cluster; the
    pulls (rows, row states) must agree bit for bit."""
    rng = np.random.default_rng(seed)
    clients = [c.client() for c in clusters]
    for s in range(steps):
        push = {}
        for n in names:
            k = rng.integers(-KEYS // 2, KEYS // 2, 300).astype(np.int64)  # duplicates too
            push[n] = (k, rng_grads(rng, len(k), DIMS[n]), 0.05)
        per_rank = []
        for _ in range(2):
            part = {}
            for n in names:
                k = np.unique(rng.integers(-KEYS // 2, KEYS // 2, 200)).astype(np.int64)
                part[n] = (k, rng_grads(rng, len(k), DIMS[n]), 0.1)
            per_rank.append(part)
        for cl in clients:
            cl.push_tables(push)
            for r, part in enumerate(per_rank):
                cl.commit_tables(session, s, r, 2, part)
            assert cl.wait_committed(session, s, 20.0) == s
        probe = {n: rng.integers(-KEYS, KEYS, 400).astype(np.int64) for n in names}  # absent too
        got = [cl.pull_tables(probe) for cl in clients]
        for g in got[1:]:
            for n in names:
                assert g[n].shape == (400, DIMS[n])
                assert np.array_equal(bits(g[n]), bits(got[0][n])), n


def assert_same_dumps(a: Shards, b: Shards, names) -> dict[str, int]:
    ca, cb = a.client(), b.client()
    rows = {}
    for n in names:
        ka, va, sa = ca.dump(table=n)
        kb, vb, sb = cb.dump(table=n)
        assert np.array_equal(ka, kb), n
        assert np.array_equal(bits(va), bits(vb)), n
        assert np.array_equal(bits(sa), bits(sb)), n
        rows[n] = len(ka)
    return rows


@pytest.mark.parametrize("num_shards", [1, 3])
def test_tables_of_three_widths_under_a_tiny_byte_budget_give_the_all_dram_bits(
    shards, tmp_path, num_shards
):
    budget = 6000  # bytes per shard: a few dozen narrow rows, a dozen or so wide ones
    dram = shards(num_shards)
    tiered = shards(num_shards, memory_bytes=budget, ssd_dir=str(tmp_path / "ssd"))
    names = list(DIMS)
    workload([dram, tiered], names)
    rows = assert_same_dumps(dram, tiered, names)
    for per_shard in zip(dram.table_stats(), tiered.table_stats()):
        all_dram, tiers = per_shard
        payload = 0  # values and state bytes in DRAM: a lower bound of what the budget counts
        for n in names:
            t = tiers[n]
            assert t["rows"] == all_dram[n]["rows"]
            assert t["rows_dram"] + t["rows_ssd"] == t["rows"], n
            assert t["rows_ssd"] > 0, n  # every table was evicted to, whatever its width
            assert all_dram[n]["rows_ssd"] == 0
            payload += t["rows_dram"] * 4 * (DIMS[n] + state_floats(n))
        assert payload <= budget
    for n in names:
        assert sum(st[n]["rows"] for st in tiered.table_stats()) == rows[n]
    assert_same_dumps(dram, tiered, names)  # the dumps moved nothing


def test_one_tables_growth_evicts_another_tables_rows(shards, tmp_path):
    """The budget is the shard's: rows of a table that stops growing leave DRAM as another
    table's rows come, so the shard holds its budget over both."""
    budget = 40_000
    s = shards(1, memory_bytes=budget, ssd_dir=str(tmp_path / "ssd"))
    cl = s.client()
    rng = np.random.default_rng(1)
    k = np.arange(300, dtype=np.int64)
    cl.push_tables({"mid": (k, rng_grads(rng, len(k), 16), 0.1)})
    before = s.table_stats()[0]["mid"]
    assert before["rows_dram"] > 0
    for lo in range(0, 3000, 500):
        k = np.arange(lo, lo + 500, dtype=np.int64)
        cl.push_tables({"wide": (k, rng_grads(rng, len(k), 64), 0.1)})
    after = s.table_stats()[0]
    assert after["mid"]["rows"] == before["rows"]
    assert after["mid"]["rows_dram"] < before["rows_dram"]
    assert after["wide"]["rows_ssd"] > 0
    payload = sum(after[n]["rows_dram"] * 4 * (DIMS[n] + state_floats(n)) for n in DIMS)
    assert payload <= budget


def test_budget_options_a_shard_cannot_serve_are_refused(tmp_path):
    ssd = str(tmp_path / "ssd")
    with pytest.raises(ValueError, match=r"memory_bytes .*needs an SSD tier"):
        Server(0, TOKEN, tables=SPECS, memory_bytes=10_000)
    with pytest.raises(ValueError, match=r"memory_rows .*counts rows of one width.*memory_bytes"):
        Server(0, TOKEN, tables=SPECS, memory_rows=100, ssd_dir=ssd)
    with pytest.raises(ValueError, match="two budgets"):
        Server(8, TOKEN, init_scale=0.1, memory_rows=100, memory_bytes=10_000, ssd_dir=ssd)


def test_a_one_table_shard_under_a_byte_budget_gives_the_all_dram_bits(shards, tmp_path):
    one = [spec("mid", 16, "rowwise_adagrad")]
    dram = shards(2, specs=one)
    tiered = shards(2, specs=one, memory_bytes=3000, ssd_dir=str(tmp_path / "ssd"))
    workload([dram, tiered], ["mid"], seed=4)
    rows = assert_same_dumps(dram, tiered, ["mid"])
    assert rows["mid"] > 0
    assert all(st["mid"]["rows_ssd"] > 0 for st in tiered.table_stats())


def test_create_tables_beside_a_row_budget_is_refused_and_creates_nothing(tmp_path):
    srv = Server(8, TOKEN, init_scale=0.1, memory_rows=100, ssd_dir=str(tmp_path / "ssd"))
    srv.start()
    try:
        cl = Client([srv.address], TOKEN, 8, timeout_s=20.0)
        with pytest.raises(PSError, match=r"counts rows of one width.*no table was created"):
            cl.create_tables([spec("mid", 16, "rowwise_adagrad")])
        assert [t["name"] for t in srv.stats()["tables"]] == ["embedding"]
    finally:
        srv.stop(2.0)


def test_tables_created_later_share_the_budget(tmp_path):
    """A standalone shard's byte budget covers the tables a job creates with CreateTables."""
    srv = Server(0, TOKEN, memory_bytes=5000, ssd_dir=str(tmp_path / "ssd"))
    srv.start()
    try:
        admin = Client([srv.address], TOKEN, 4, timeout_s=20.0)
        assert admin.create_tables(SPECS) == [{"created": 3, "existing": 0}]
        cl = Client([srv.address], TOKEN, 0, tables=list(DIMS.items()))
        rng = np.random.default_rng(2)
        k = np.arange(500, dtype=np.int64)
        cl.push_tables({n: (k, rng_grads(rng, len(k), d), 0.1) for n, d in DIMS.items()})
        tables = {t["name"]: t for t in srv.stats()["tables"]}
        assert all(tables[n]["rows"] == 500 and tables[n]["rows_ssd"] > 0 for n in DIMS)
        payload = sum(tables[n]["rows_dram"] * 4 * (DIMS[n] + state_floats(n)) for n in DIMS)
        assert payload <= 5000
    finally:
        srv.stop(2.0)


def test_save_and_load_across_shard_counts_under_byte_budgets(shards, tmp_path):
    """Rows saved by two tiered shards load into three tiered and one all-DRAM shard with the
    same bits; a load fills each table's DRAM only up to its share of the budget."""
    ck = tmp_path / "ck"
    names = list(DIMS)
    dram = shards(2, checkpoint_dir=str(ck))
    tiered = shards(2, checkpoint_dir=str(ck), memory_bytes=6000, ssd_dir=str(tmp_path / "a"))
    workload([dram, tiered], names, seed=6, steps=3)
    cl = tiered.client()
    paths = [f"t/shard-{i}-of-2.bin" for i in range(2)]
    res = cl.save(paths, 3)
    sizes, sums = [r["bytes"] for r in res], [r["checksum"] for r in res]
    three = shards(3, checkpoint_dir=str(ck), memory_bytes=6000, ssd_dir=str(tmp_path / "b"))
    one = shards(1, checkpoint_dir=str(ck))
    for c in (three, one):
        c.client().load(paths, sizes, sums)
        assert_same_dumps(dram, c, names)
    for st in three.table_stats():
        assert all(st[n]["rows_ssd"] > 0 for n in names)
        assert sum(st[n]["rows_dram"] * 4 * (DIMS[n] + state_floats(n)) for n in names) <= 6000
    workload([dram, three, one], names, seed=7, steps=2, session=4)  # training goes on alike
    assert_same_dumps(dram, three, names)
    assert_same_dumps(dram, one, names)


def test_pulls_of_every_table_during_commits_keep_the_bits(shards, tmp_path):
    """Pulls promote rows of one table while another table's update splits the budget and
    evicts from the first: the rows end as the all-DRAM shard's."""
    names = list(DIMS)
    dram = shards(1)
    tiered = shards(1, memory_bytes=8000, ssd_dir=str(tmp_path / "ssd"))
    stop = threading.Event()
    errors: list[BaseException] = []

    def pull_loop(seed: int):
        cl = tiered.client()
        rng = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                cl.pull_tables({n: rng.integers(-KEYS, KEYS, 150).astype(np.int64) for n in names})
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=pull_loop, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    try:
        workload([dram, tiered], names, seed=8, steps=6)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    assert_same_dumps(dram, tiered, names)


def test_the_standalone_shard_takes_a_byte_budget(tmp_path):
    """python -m cpu_dist.sparse.server --ps-memory-bytes B --ps-ssd-dir DIR."""
    tf = tmp_path / "token"
    tf.write_text(TOKEN)
    flags = ["--port", "0", "--dim", "8", "--token-file", str(tf), "--ps-memory-bytes", "3000"]
    srv = make_server(parse_args([*flags, "--ps-ssd-dir", str(tmp_path / "ssd")]), TOKEN)
    srv.start()
    try:
        cl = Client([srv.address], TOKEN, 8, timeout_s=20.0)
        k = np.arange(400, dtype=np.int64)
        cl.push(k, np.ones((400, 8), np.float32), 0.1)
        st = srv.stats()
        assert st["rows"] == 400 and 0 < st["rows_dram"] < 400 and st["rows_ssd"] > 0
    finally:
        srv.stop(2.0)
    with pytest.raises(ValueError, match="needs an SSD tier"):
        make_server(parse_args(flags), TOKEN)


def test_a_table_left_over_its_share_by_a_step_of_every_table_evicts_at_the_next(shards, tmp_path):
    """A step over several tables holds every table's lock, so a split during it can evict
    only from the table being applied; the others evict at their next step, even one that
    brings them no rows: then the shard is back within its budget."""
    budget = 40_000
    s = shards(1, memory_bytes=budget, ssd_dir=str(tmp_path / "ssd"))
    cl = s.client()
    rng = np.random.default_rng(3)
    none = np.zeros(0, np.int64)

    def step(i: int, rows: dict[str, np.ndarray]) -> None:
        parts = {n: (k, rng_grads(rng, len(k), DIMS[n]), 0.1) for n, k in rows.items()}
        cl.commit_tables(5, i, 0, 1, parts)
        assert cl.wait_committed(5, i, 20.0) == i

    step(0, {"mid": np.arange(300, dtype=np.int64), "narrow": none, "wide": none})
    before = s.table_stats()[0]["mid"]["rows_dram"]
    for i in range(1, 6):  # only "wide" grows; "mid" comes first in name order
        step(i, {"mid": none, "narrow": none, "wide": np.arange(500 * i, 500 * i + 500)})
    step(6, {"mid": none, "narrow": none, "wide": np.arange(3)})  # too few rows for a split
    after = s.table_stats()[0]
    assert after["mid"]["rows_dram"] < before
    payload = sum(after[n]["rows_dram"] * 4 * (DIMS[n] + state_floats(n)) for n in DIMS)
    assert payload <= budget
