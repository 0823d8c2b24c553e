"""The parameter server's admission and expiry rules in the local rows (``LocalRows``): a row
appears and moves only from its N-th step, expired rows read their first-touch value again
with state 0, a table no forward used still expires, every step equals an independent oracle
(the single-process reference's ``TableRules``) bit for bit, a table's arrays round-trip
mid-run and training continues identically, and a table without rules keeps today's bits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpu_dist.common.contracts import row_init, sparse_update, state_floats
from cpu_dist.embeddings import EmbeddingBagConfig, LocalRows
from cpu_dist.embeddings.rows import RULE_ARRAYS

pytestmark = pytest.mark.timeout(60)

SEED = 5


class TableRules:
    """The oracle: ``cpu_dist/train/reference.py``'s ``TableRules`` as it was when that
    reference was verified bit for bit against real shards (commit 680bdff; the module is
    gone since the reference became the model with local rows), copied unchanged.  It keeps
    its own per-key arrays over a fixed key set, so it shares no code with ``LazyTable``.

    At step t (its union of keys, ``idx``): every key's count grows by one; a key's gradient is
    applied once its count reaches N (until then it reads its first-touch row and holds no
    row); then every row last updated at t-S or earlier is dropped (first-touch value, state
    0, count 0), and so is the count of a key never admitted and last seen at t-S or earlier."""

    def __init__(self, size: int, admit_after: int = 0, expire_after: int = 0) -> None:
        self.admit_after, self.expire_after = admit_after, expire_after
        self.count = np.zeros(size, dtype=np.int64)
        self.last_update = np.full(size, -1, dtype=np.int64)  # -1: no row held
        self.last_seen = np.full(size, -1, dtype=np.int64)

    def admitted(self, step: int, idx: np.ndarray) -> np.ndarray:
        """Bool per key of ``idx`` (the step's union): its gradient is applied."""
        self.count[idx] += 1
        self.last_seen[idx] = step
        ok = self.count[idx] >= max(self.admit_after, 1)
        self.last_update[idx[ok]] = step
        return ok

    def expired(self, step: int) -> np.ndarray:
        """Indices of the rows dropped when ``step`` commits (their counts are reset)."""
        if self.expire_after <= 0:
            return np.zeros(0, dtype=np.int64)
        horizon = step - self.expire_after
        held = self.last_update >= 0
        drop = np.flatnonzero(held & (self.last_update <= horizon))
        waiting = np.flatnonzero(~held & (self.count > 0) & (self.last_seen <= horizon))
        self.count[drop] = 0
        self.count[waiting] = 0
        self.last_update[drop] = -1
        return drop

    @property
    def held(self) -> np.ndarray:
        """Bool per key: the PS holds a row for it (admitted, not expired)."""
        return self.last_update >= 0


class OracleTable:
    """One table as the reference held it: every key of the run's key set as a row (first
    touch ``row_init``), its optimizer state, and :class:`TableRules`; the step's gradients
    summed per key in the order the forwards ran."""

    def __init__(self, config: EmbeddingBagConfig, keys: np.ndarray) -> None:
        self.c, self.keys = config, keys
        self.rows = self._first(keys)
        width = state_floats(config.optimizer, config.embedding_dim)
        shape = (len(keys), config.embedding_dim) if width > 1 else (len(keys),)
        self.state = np.zeros(shape, dtype=np.float32)
        self.rules = TableRules(len(keys), config.admit_after, config.expire_after)
        self.dropped = 0

    def _first(self, keys: np.ndarray) -> np.ndarray:
        c = self.c
        return row_init(SEED, keys, c.embedding_dim, c.init_scale, c.name)

    def step(self, t: int, parts: list[tuple[np.ndarray, np.ndarray | None]]) -> int:
        dim = self.c.embedding_dim
        union = np.unique(np.concatenate([p[0] for p in parts] or [np.zeros(0, np.int64)]))
        g = np.zeros((len(union), dim), dtype=np.float32)
        for ids, w in parts:
            if w is not None:
                g[np.searchsorted(union, ids)] += w
        idx = np.searchsorted(self.keys, union)
        ok = self.rules.admitted(t, idx)
        at = idx[ok]
        rows, state = self.rows[at], self.state[at]
        extra = {"eps": self.c.eps} if self.c.optimizer == "adagrad" else {}
        sparse_update(self.c.optimizer, rows, state, g[ok], self.c.lr, **extra)
        self.rows[at], self.state[at] = rows, state
        drop = self.rules.expired(t)
        self.dropped += len(drop)
        self.rows[drop] = self._first(self.keys[drop])
        self.state[drop] = 0.0
        return int(ok.sum())

    def held(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        h = self.rules.held
        return self.keys[h], self.rows[h], self.state[h]


def config(name: str = "t", admit: int = 0, expire: int = 0, **kw) -> EmbeddingBagConfig:
    kw.setdefault("lr", 0.25)
    return EmbeddingBagConfig(
        0, 3, name, feature_names=[f"{name}_f"], admit_after=admit, expire_after=expire, **kw
    )


def local(*configs: EmbeddingBagConfig) -> LocalRows:
    return LocalRows(configs, {c.name: SEED for c in configs})


def ids_of(*values: int) -> np.ndarray:
    return np.array(sorted(set(values)), dtype=np.int64)


def forward(rows: LocalRows, table: str, ids: np.ndarray, w: np.ndarray | None) -> None:
    """One forward's lookup of ``ids``; with ``w`` a backward whose row gradients are ``w``
    exactly (d/d rows of sum(rows * w)), without one no backward at all (no gradient)."""
    looked = rows.lookup(table, ids)
    if w is not None:
        (looked * torch.from_numpy(w)).sum().backward()


def grads(rng: np.random.Generator, n: int, zero: float = 0.2) -> np.ndarray:
    """Gradients [n, 3] with some exact (+0.0) zero rows: a looked-up id whose loss term is 0."""
    g = rng.standard_normal((n, 3)).astype(np.float32)
    return np.where(rng.random((n, 1)) < zero, np.float32(0.0), g)


def read(rows: LocalRows, table: str, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return rows.lookup(table, ids).numpy()


def first(c: EmbeddingBagConfig, ids: np.ndarray) -> np.ndarray:
    return row_init(SEED, ids, c.embedding_dim, c.init_scale, c.name)


def test_a_row_appears_and_moves_only_from_its_nth_step():
    c = config(admit=3)
    rows = local(c)
    five, g = ids_of(5), np.full((1, 3), 2.0, dtype=np.float32)
    for step in range(2):
        forward(rows, "t", ids_of(5, 8) if step == 0 else five, np.full((2 - step, 3), 2.0, "f4"))
        assert rows.sparse_step() == {"t": 0}, step
        assert len(rows.tables["t"]) == 0  # no row held: a waiting id reads its first touch
        np.testing.assert_array_equal(read(rows, "t", five), first(c, five))
    forward(rows, "t", five, g)
    assert rows.sparse_step() == {"t": 1}  # its third step: admitted, its gradient applied
    np.testing.assert_array_equal(rows.tables["t"].ids, five)
    want = first(c, five) - np.float32(0.25) * g
    np.testing.assert_array_equal(rows.tables["t"].rows, want)
    np.testing.assert_array_equal(read(rows, "t", five), want)
    # id 8 was counted once and, without expiry, keeps its count: two more steps admit it
    for step in range(2):
        forward(rows, "t", ids_of(5, 8), np.ones((2, 3), "f4"))
        assert rows.sparse_step() == {"t": 1 + step}
    np.testing.assert_array_equal(rows.tables["t"].ids, ids_of(5, 8))


def test_lookups_without_autograd_never_create_or_count():
    c = config(admit=2)
    rows, seven = local(c), ids_of(7)
    for _ in range(3):
        read(rows, "t", seven)
        assert rows.sparse_step() == {"t": 0}
    forward(rows, "t", seven, np.ones((1, 3), "f4"))
    assert rows.sparse_step() == {"t": 0}  # its first counted step
    assert len(rows.tables["t"]) == 0
    # a recording lookup that got no gradient counts (a zero gradient), as a pushed id does
    forward(rows, "t", seven, None)
    assert rows.sparse_step() == {"t": 1}
    np.testing.assert_array_equal(rows.tables["t"].rows, first(c, seven))  # zero gradient


@pytest.mark.parametrize("optimizer", ["rowwise_adagrad", "adagrad"])
def test_expired_rows_read_their_first_touch_again_with_state_zero(optimizer):
    c = config(expire=2, optimizer=optimizer)
    rows, three = local(c), ids_of(3)
    g = np.array([[1.0, -2.0, 0.5]], dtype=np.float32)
    forward(rows, "t", three, g)
    rows.sparse_step()  # step 0: updated
    table = rows.tables["t"]
    assert np.all(table.state != 0) and not np.array_equal(table.rows, first(c, three))
    assert rows.sparse_step() == {"t": 0}  # step 1: untouched, horizon -1: kept
    np.testing.assert_array_equal(table.ids, three)
    rows.sparse_step()  # step 2: horizon 0 >= its last update: dropped
    assert len(table) == 0
    np.testing.assert_array_equal(read(rows, "t", three), first(c, three))
    forward(rows, "t", three, g)
    rows.sparse_step()  # readmitted: from its first touch with state 0, as a new row
    fresh_rows, width = first(c, three), state_floats(optimizer, 3)
    fresh_state = np.zeros((1, 3) if width > 1 else (1,), dtype=np.float32)
    extra = {"eps": c.eps} if optimizer == "adagrad" else {}
    sparse_update(optimizer, fresh_rows, fresh_state, g, c.lr, **extra)
    np.testing.assert_array_equal(table.rows, fresh_rows)
    np.testing.assert_array_equal(table.state, fresh_state)


def test_a_waiting_ids_count_expires_with_its_last_seen_step():
    rows = local(config(admit=2, expire=2))
    one = np.ones((1, 3), "f4")
    for step in range(4):  # seen at steps 0 and 3: the count of step 0 expired at step 2
        if step in (0, 3):
            forward(rows, "t", ids_of(4), one)
        assert rows.sparse_step() == {"t": 0}, step
    forward(rows, "t", ids_of(4), one)  # step 4: its second counted step
    assert rows.sparse_step() == {"t": 1}


def test_a_table_no_forward_used_still_expires_at_that_step():
    a, b = config("a", expire=1), config("b", expire=1)
    rows = local(a, b)
    forward(rows, "a", ids_of(1), np.ones((1, 3), "f4"))
    forward(rows, "b", ids_of(2, 9), np.ones((2, 3), "f4"))
    assert rows.sparse_step() == {"a": 1, "b": 2}
    forward(rows, "a", ids_of(1), np.ones((1, 3), "f4"))
    assert rows.sparse_step() == {"a": 1, "b": 0}  # step 1: b unused, its rows of step 0 go
    np.testing.assert_array_equal(rows.tables["a"].ids, ids_of(1))
    assert len(rows.tables["b"]) == 0
    np.testing.assert_array_equal(read(rows, "b", ids_of(2, 9)), first(b, ids_of(2, 9)))


def drive(
    rows: LocalRows,
    oracles: dict[str, OracleTable] | None,
    rng: np.random.Generator,
    step: int,
    universe: int,
) -> dict[str, int]:
    """One step of random forwards on every table (none on some, two on others, one without
    a backward now and then) through ``rows`` and, alike, ``oracles``; returns the local
    step's rows updated, checked against the oracles'."""
    parts: dict[str, list[tuple[np.ndarray, np.ndarray | None]]] = {}
    for name in rows.tables:
        for _ in range(int(rng.integers(0, 3))):
            ids = np.unique(rng.integers(0, universe, int(rng.integers(1, 12)))).astype(np.int64)
            w = None if rng.random() < 0.15 else grads(rng, len(ids))
            forward(rows, name, ids, w)
            parts.setdefault(name, []).append((ids, w))
    got = rows.sparse_step()
    if oracles is not None:
        want = {n: o.step(step, parts.get(n, [])) for n, o in oracles.items()}
        assert got == want, step
    return got


def assert_equal_to_oracles(rows: LocalRows, oracles: dict[str, OracleTable], step: int) -> None:
    for name, oracle in oracles.items():
        table, (ids, values, state) = rows.tables[name], oracle.held()
        np.testing.assert_array_equal(table.ids, ids, err_msg=f"{name} at step {step}")
        np.testing.assert_array_equal(table.rows, values, err_msg=f"{name} at step {step}")
        np.testing.assert_array_equal(table.state, state, err_msg=f"{name} at step {step}")
        n = len(table)
        np.testing.assert_array_equal(read(rows, name, oracle.keys), oracle.rows)
        assert len(table) == n  # reading every key created nothing


@pytest.mark.parametrize(
    ("admit", "expire", "optimizer"),
    [(3, 0, "sgd"), (0, 2, "rowwise_adagrad"), (2, 3, "adagrad"), (4, 1, "rowwise_adagrad")],
)
def test_every_step_equals_the_reference_table_rules(admit, expire, optimizer):
    universe = 16
    configs = [
        config("x", admit, expire, optimizer=optimizer),
        config("y", admit, expire, optimizer=optimizer, lr=0.1),
    ]
    rows = local(*configs)
    keys = np.arange(universe, dtype=np.int64)
    oracles = {c.name: OracleTable(c, keys) for c in configs}
    rng = np.random.default_rng(admit * 10 + expire)
    updated = 0
    for step in range(14):
        updated += sum(drive(rows, oracles, rng, step, universe).values())
        assert_equal_to_oracles(rows, oracles, step)
    # the stream admitted rows and expired some: the comparison is not of empty tables
    assert updated > 0 and (expire == 0 or sum(o.dropped for o in oracles.values()) > 0)


def test_arrays_round_trip_mid_run_and_training_continues_identically():
    configs = [config("x", 2, 2, optimizer="rowwise_adagrad"), config("y", 0, 0)]
    rows = local(*configs)
    rng = np.random.default_rng(1)
    for step in range(6):
        drive(rows, None, rng, step, 30)
    saved = {n: t.arrays() for n, t in rows.tables.items()}
    assert set(saved["x"]) == {"ids", "weight", "optimizer_state", *RULE_ARRAYS}
    assert set(saved["y"]) == {"ids", "weight", "optimizer_state"}  # no rules: as before
    assert int(saved["x"]["step"]) == 6 and len(saved["x"]["count_ids"]) > 0
    resumed = local(*configs)
    for name, arrays in saved.items():
        resumed.tables[name].load(arrays)
    assert resumed.step == rows.step == 6
    for step in range(6, 14):
        seed = int(rng.integers(1 << 30))
        for src in (rows, resumed):
            drive(src, None, np.random.default_rng(seed), step, 30)
        for name in rows.tables:
            for key, value in rows.tables[name].arrays().items():
                got = resumed.tables[name].arrays()[key]
                np.testing.assert_array_equal(got, value, err_msg=f"{name}.{key} at {step}")


def test_arrays_of_other_rules_are_refused_naming_the_table():
    ruled, plain = local(config("x", 2, 2)).tables["x"], local(config("x")).tables["x"]
    forward_rows = local(config("x", 2, 2))
    forward(forward_rows, "x", ids_of(1, 2), np.ones((2, 3), "f4"))
    forward_rows.sparse_step()
    arrays = forward_rows.tables["x"].arrays()
    rows_only = {k: arrays[k] for k in ("ids", "weight", "optimizer_state")}
    with pytest.raises(ValueError, match=r"table 'x': no last_update, count_ids.*admit_after 2"):
        ruled.check(rows_only)
    with pytest.raises(ValueError, match=r"table 'x': last_update.*no admit_after / expire_after"):
        plain.check(arrays)
    counted = {**arrays, "count": arrays["count"] + 1}  # a count of 2 would have admitted it
    with pytest.raises(ValueError, match=r"table 'x': count must be .* admit_after 2"):
        ruled.check(counted)
    ruled.check(arrays)


def test_start_at_numbers_the_steps_and_tables_carry_theirs():
    c = config(expire=3)
    rows = local(c, config("plain"))
    rows.start_at(10)
    assert rows.step == 10
    forward(rows, "t", ids_of(6), np.ones((1, 3), "f4"))
    rows.sparse_step()
    assert rows.step == 11
    np.testing.assert_array_equal(rows.tables["t"].arrays()["last_update"], [10])
    other = local(c, config("u", expire=1))
    other.tables["t"].load(rows.tables["t"].arrays())
    with pytest.raises(ValueError, match=r"different steps \('t': 11, 'u': 0\).*start_at"):
        _ = other.step
    with pytest.raises(ValueError, match="start_at: step -1"):
        rows.start_at(-1)


@pytest.mark.parametrize("admit", [0, 1])
def test_without_rules_every_looked_up_id_is_updated_as_before(admit):
    """Admission 0 and 1 are both off: every id a step looked up while recording is held from
    the lookup on (the step will update it) and updated by the step, bit for bit as the
    oracle with no rules; ``zero_grad`` drops the rows of an abandoned step."""
    c = config(admit=admit, optimizer="rowwise_adagrad")
    rows, keys = local(c), np.arange(25, dtype=np.int64)
    oracle = {"t": OracleTable(c, keys)}
    rng = np.random.default_rng(7)
    for step in range(8):
        drive(rows, oracle, rng, step, 25)
        assert_equal_to_oracles(rows, oracle, step)
    table, before = rows.tables["t"], rows.tables["t"].arrays()
    new = ids_of(100, 101)
    forward(rows, "t", np.concatenate([before["ids"][:2], new]), None)
    np.testing.assert_array_equal(table.ids, np.union1d(before["ids"], new))  # held mid-step
    rows.zero_grad()  # the step is abandoned: its new rows go, the others are untouched
    for key, value in table.arrays().items():
        np.testing.assert_array_equal(value, before[key], err_msg=key)
    assert rows.sparse_step() == {"t": 0}
