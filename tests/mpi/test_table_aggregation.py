"""A step of several tables across real worker ranks: one id exchange gives every table's
union, and the collective aggregation of all tables at once equals each table's own."""

import numpy as np
import pytest
from mpi4py import MPI

from cpu_dist.sparse.aggregation import CollectiveAggregation, PsAggregation, key_unions

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(60)]

DIMS = {"narrow": 2, "empty_here": 3, "wide": 7}


def _parts(rank: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Different keys per rank and table (overlapping), one table with no keys on rank 0;
    integer-valued gradients so that any order of the sums is exact."""
    g = np.random.default_rng(rank)
    out = {}
    for t, (name, dim) in enumerate(DIMS.items()):
        n = 0 if (name == "empty_here" and rank == 0) else 5 + rank + t
        keys = np.unique(g.integers(0, 20, size=n)).astype(np.int64)
        out[name] = (keys, g.integers(-4, 5, size=(len(keys), dim)).astype(np.float32))
    return out


def test_one_exchange_gives_every_tables_union():
    comm = MPI.COMM_WORLD
    everyone = [_parts(r) for r in range(comm.Get_size())]
    got = key_unions(comm, {n: k for n, (k, _) in everyone[comm.Get_rank()].items()})
    assert list(got) == list(DIMS)
    for name in DIMS:
        want = np.unique(np.concatenate([p[name][0] for p in everyone]))
        np.testing.assert_array_equal(got[name], want)


def test_collective_over_tables_equals_each_tables_own_reduce():
    comm = MPI.COMM_WORLD
    mine = _parts(comm.Get_rank())
    agg = CollectiveAggregation(comm)
    together = agg.reduce_tables(mine)
    assert list(together) == list(DIMS)
    for name, (keys, grads) in mine.items():
        alone = agg.reduce(keys, grads)  # one table at a time, as a one-table job does
        got = together[name]
        np.testing.assert_array_equal(got.keys, alone.keys)
        np.testing.assert_array_equal(got.grads, alone.grads)
        np.testing.assert_array_equal(got.written, alone.written)
        np.testing.assert_array_equal(got.summed, alone.summed)
        assert got.grads.shape[1] == DIMS[name]
    # every row of every table is sent by exactly one worker
    for name in DIMS:
        sent = comm.allgather(together[name].keys)
        np.testing.assert_array_equal(np.sort(np.concatenate(sent)), together[name].written)


def test_ps_aggregation_sends_its_own_rows_and_learns_the_unions_only_when_asked():
    comm = MPI.COMM_WORLD
    mine = _parts(comm.Get_rank())
    plain = PsAggregation(comm).reduce_tables(mine)
    for name, (keys, grads) in mine.items():
        assert plain[name].keys is keys and plain[name].grads is grads
        assert plain[name].written is None
    asked = PsAggregation(comm, exchange_ids=True).reduce_tables(mine)
    unions = key_unions(comm, {n: k for n, (k, _) in mine.items()})
    for name in DIMS:
        np.testing.assert_array_equal(asked[name].written, unions[name])


def test_unions_given_by_the_caller_replace_the_exchange():
    """The cache stage knows every table's union from its plans: both aggregations take them
    as they are (the collective one gives what its own exchange would, exactly)."""
    comm = MPI.COMM_WORLD
    mine = _parts(comm.Get_rank())
    unions = key_unions(comm, {n: k for n, (k, _) in mine.items()})
    agg = CollectiveAggregation(comm)
    given, exchanged = agg.reduce_tables(mine, unions), agg.reduce_tables(mine)
    for name in DIMS:
        for field in ("keys", "grads", "written", "summed"):
            np.testing.assert_array_equal(
                getattr(given[name], field), getattr(exchanged[name], field), err_msg=name
            )
    ps = PsAggregation(comm).reduce_tables(mine, unions)
    for name in DIMS:
        assert ps[name].written is unions[name]


def test_the_cache_plans_every_table_with_one_exchange_as_each_alone():
    from gpu_cache.plans import OnlinePlanner, OnlineTablesPlanner

    comm = MPI.COMM_WORLD
    mine = {n: k for n, (k, _) in _parts(comm.Get_rank()).items()}
    together = OnlineTablesPlanner(comm).plan(3, mine)
    alone = OnlinePlanner(comm)
    assert list(together) == list(DIMS)
    for name, keys in mine.items():
        want = alone.plan(3, keys)
        got = together[name]
        assert got.step == 3 and got.scores is None and got.prev is None
        np.testing.assert_array_equal(got.keys, keys)
        np.testing.assert_array_equal(got.union, want.union)
        np.testing.assert_array_equal(got.shared, want.shared)
