"""Admission and expiry (csrc/table_rules.h) against a numpy model written from the rules'
text: the shards hold exactly the model's rows, bit for bit, for any shard count, with or
without an SSD tier, across a checkpoint into another shard count; Push is not subject to
them."""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import rng_grads
from .reference import RefTable

pytestmark = pytest.mark.timeout(180)
DIM = 4
W = 2  # ranks


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


class RulesModel:
    """The rules as the docs state them, on a RefTable (held rows only)."""

    def __init__(self, seed: int, scale: float, admit: int, expire: int):
        self.t = RefTable(DIM, seed, scale)
        self.admit, self.expire = admit, expire
        self.count: dict[int, int] = {}
        self.seen: dict[int, int] = {}
        self.updated: dict[int, int] = {}  # last-update step of held rows made by commits
        self.admitted = self.expired = 0

    def commit(self, per_rank, lr: float, optimizer: str, t: int) -> None:
        union = sorted({k for keys, _ in per_rank for k in keys.tolist()})
        ok = set()
        for k in union:
            self.count[k] = self.count.get(k, 0) + 1
            self.seen[k] = t
            if k in self.t.w or self.count[k] >= max(self.admit, 1):
                ok.add(k)
                self.admitted += k not in self.t.w
        kept = []
        for keys, grads in per_rank:
            m = np.array([k in ok for k in keys.tolist()], bool)
            kept.append((keys[m], grads[m]))
        self.t.commit(kept, lr, optimizer)
        for k in ok:
            self.updated[k] = t
        if self.expire <= 0:
            return
        horizon = t - self.expire
        for k in [k for k, u in self.updated.items() if u <= horizon]:
            del self.t.w[k], self.t.s[k], self.updated[k]
            self.count[k] = 0
            self.expired += 1
        for k in list(self.count):
            if k not in self.t.w and self.count[k] > 0 and self.seen[k] <= horizon:
                self.count[k] = 0

    def pending(self) -> int:
        return sum(1 for k, c in self.count.items() if c > 0 and k not in self.t.w)


def steps_of(seed: int, n: int, space: int = 60):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        per_rank = []
        for _ in range(W):
            k = np.unique(rng.integers(0, space, rng.integers(0, 20))).astype(np.int64)
            per_rank.append((k, rng_grads(rng, len(k), DIM)))
        out.append(per_rank)
    return out


def run_steps(cl, session: int, base: int, steps, optimizer: str, model=None, first: int = 0):
    for s, per_rank in enumerate(steps):
        step = first + s
        for r, (k, g) in enumerate(per_rank):
            cl.commit(session, step, r, W, k, g, 0.1, optimizer, base_step=base)
        assert cl.wait_committed(session, step, 20.0) == step
        if model is not None:
            model.commit(per_rank, 0.1, optimizer, base + step)


def check(cluster, model: RulesModel) -> None:
    k, v, s = cluster.client().dump()
    rk, rv, rs = model.t.dump()
    assert np.array_equal(k, rk)
    assert np.array_equal(bits(v), bits(rv)) and np.array_equal(bits(s), bits(rs))
    st = [srv.stats() for srv in cluster.servers]
    assert sum(x["rows_admitted"] for x in st) == model.admitted
    assert sum(x["rows_expired"] for x in st) == model.expired
    assert sum(x["pending_counts"] for x in st) == model.pending()


@pytest.mark.parametrize("admit,expire", [(3, 0), (0, 2), (2, 3)])
@pytest.mark.parametrize("num_shards,tiered", [(1, False), (2, True), (3, False)])
def test_the_shards_hold_the_models_rows(
    cluster_factory, tmp_path, admit, expire, num_shards, tiered
):
    kw = {"memory_rows": 6, "ssd_dir": str(tmp_path / "ssd")} if tiered else {}
    c = cluster_factory(num_shards, DIM, admit_after=admit, expire_after=expire, **kw)
    model = RulesModel(c.seed, c.init_scale, admit, expire)
    cl = c.client()
    steps = steps_of(1, 14)
    for i in range(0, len(steps), 2):  # check every other step
        run_steps(cl, 7, 100, steps[i : i + 2], "rowwise_adagrad", model, first=i)
        check(c, model)
    assert model.admitted > 0
    if expire:
        assert model.expired > 0
    # A key not admitted (or dropped) reads its first-touch row and holds none.
    probe = np.arange(0, 70, dtype=np.int64)
    want = np.stack([model.t.get(k) for k in probe.tolist()])
    assert np.array_equal(bits(cl.pull(probe)), bits(want))
    assert [h["admit_after"] for h in cl.health()] == [admit] * num_shards
    assert [h["expire_after"] for h in cl.health()] == [expire] * num_shards


def test_counts_and_steps_survive_a_checkpoint_into_another_shard_count(cluster_factory, tmp_path):
    ck = str(tmp_path / "ck")
    rules = {"admit_after": 2, "expire_after": 3, "checkpoint_dir": ck}
    steps = steps_of(4, 12)
    whole = cluster_factory(2, DIM, **rules)
    model = RulesModel(whole.seed, whole.init_scale, 2, 3)
    run_steps(whole.client(), 1, 0, steps, "sgd", model)
    check(whole, model)
    # The same first 6 steps, saved at job step 5, restored into 3 shards (one tiered), and the
    # rest in a new session whose step 0 is job step 6.
    first = cluster_factory(2, DIM, **rules)
    a = first.client()
    run_steps(a, 2, 0, steps[:6], "sgd")
    paths = [f"s5/shard-{i}-of-2.bin" for i in range(2)]
    res = a.save(paths, 5, session=2, session_step=5)
    assert sum(r["rows"] for r in res) == sum(s.stats()["rows"] for s in first.servers)
    second = cluster_factory(3, DIM, memory_rows=4, ssd_dir=str(tmp_path / "ssd"), **rules)
    b = second.client()
    b.load(paths, [r["bytes"] for r in res], [r["checksum"] for r in res])
    assert sum(s.stats()["pending_counts"] for s in second.servers) == sum(
        s.stats()["pending_counts"] for s in first.servers
    )
    run_steps(b, 3, 6, steps[6:], "sgd")
    k, v, s = b.dump()
    rk, rv, rs = model.t.dump()
    assert np.array_equal(k, rk) and np.array_equal(bits(v), bits(rv))
    assert np.array_equal(bits(s), bits(rs))
    assert sum(x.stats()["pending_counts"] for x in second.servers) == model.pending()


def test_push_is_not_subject_to_the_rules(cluster_factory):
    c = cluster_factory(1, DIM, admit_after=3, expire_after=1)
    cl = c.client()
    pushed = np.arange(5, dtype=np.int64)
    cl.push(pushed, np.ones((5, DIM), np.float32), 0.1)  # rows at once, no count needed
    assert c.rows() == 5
    empty = (np.zeros(0, np.int64), np.zeros((0, DIM), np.float32))
    for step in range(3):  # steps without them: pushed rows have no step, so never expire
        cl.commit(9, step, 0, 1, *empty, 0.1)
    assert cl.wait_committed(9, 2, 10.0) == 2 and c.rows() == 5
    # A commit touching a pushed row applies (it has a row) and stamps it: it then expires.
    cl.commit(9, 3, 0, 1, pushed[:2], np.ones((2, DIM), np.float32), 0.1)
    cl.commit(9, 4, 0, 1, *empty, 0.1)
    assert cl.wait_committed(9, 4, 10.0) == 4
    assert c.rows() == 3 and c.servers[0].stats()["rows_expired"] == 2


def test_base_step_is_constant_per_session(cluster_factory):
    from cpu_dist.sparse import PSError

    c = cluster_factory(1, DIM)
    cl = c.client()
    k, g = np.arange(2, dtype=np.int64), np.ones((2, DIM), np.float32)
    cl.commit(4, 0, 0, 2, k, g, 0.1, base_step=10)
    with pytest.raises(PSError, match="base_step 11 does not match session 4 base_step 10"):
        cl.commit(4, 0, 1, 2, k, g, 0.1, base_step=11)
    with pytest.raises(ValueError, match="base_step must be >= 0"):
        cl.commit(4, 0, 1, 2, k, g, 0.1, base_step=-1)
