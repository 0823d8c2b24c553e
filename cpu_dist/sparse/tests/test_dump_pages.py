"""Dump in pages: a shard far bigger than one message dumps completely with its memory
bounded by a page, pages hold whole partitions (a partition bigger than the page goes out in
key ranges), and dump_pages streams them holding at most one page per shard."""

import contextlib

import numpy as np
import pytest

from cpu_dist.common.tokens import write_token_file
from cpu_dist.sparse import NUM_PARTITIONS, Client, partition_of, row_init
from cpu_dist.testing.shards import standalone_shard

from .conftest import TOKEN

DIM = 16
ROW_BYTES = 8 + 4 * DIM + 4  # key, values, state


@contextlib.contextmanager
def shard_process(tmp_path, dim: int, seed: int = 3, scale: float = 0.25):
    """A shard in a process of its own, so that its memory is its own."""
    tf = tmp_path / "token"
    write_token_file(str(tf), TOKEN)
    extra = ["--seed", str(seed), "--init-scale", str(scale)]
    with standalone_shard(str(tf), dim, extra=extra) as (address, _):
        yield address


@pytest.mark.timeout(300)
def test_a_million_rows_on_one_shard_dump_whole_with_memory_bounded_by_pages(tmp_path):
    n, batch, seed, scale = 1_000_000, 100_000, 3, 0.25
    rng = np.random.default_rng(0)
    keys = rng.permutation(np.arange(n, dtype=np.int64) * 7919 - 3_000_000)
    grads = rng.standard_normal((n, DIM)).astype(np.float32)
    with shard_process(tmp_path, DIM, seed, scale) as address:
        cl = Client([address], TOKEN, DIM, timeout_s=60.0)
        for i in range(0, n, batch):  # bulk load: w = row_init - 1.0 * g
            cl.push(keys[i : i + batch], grads[i : i + batch], 1.0)
        loaded = cl.stats()[0]
        assert loaded["rows"] == n
        # One reply of the whole table would be 76 MB, over the 64 MiB message limit.
        assert n * ROW_BYTES > 64 << 20
        k, v, s = cl.dump()
        after = cl.stats()[0]
    order = np.argsort(keys)
    assert np.array_equal(k, keys[order])
    want = row_init(seed, keys, DIM, scale) - grads
    assert np.array_equal(v, want[order])
    assert not s.any()  # SGD keeps no state
    # The shard's peak memory grew by a few pages, not by copies of the table.
    grew = after["peak_resident_bytes"] - loaded["peak_resident_bytes"]
    table_mib = loaded["table_bytes"] >> 20
    print(f"FIGURE dump of {n} rows: table {table_mib} MiB, peak grew {grew >> 20} MiB")
    assert grew < 32 << 20, grew


@pytest.fixture
def loaded(cluster_factory):
    """Two shards holding 3000 rows, and the rows as written."""
    c = cluster_factory(num_shards=2, dim=4)
    cl = c.client()
    rng = np.random.default_rng(1)
    keys = rng.choice(10**9, 3000, replace=False).astype(np.int64)
    cl.push(keys, rng.standard_normal((3000, 4)).astype(np.float32), 0.5)
    return c, cl, keys


def test_pages_hold_whole_partitions_sorted_and_cover_every_row(loaded):
    _c, cl, keys = loaded
    budget = 40 * (8 + 4 * 4 + 4)  # about 40 rows: a few partitions per page
    pages = list(cl.dump_pages(max_bytes=budget))
    seen = np.concatenate([p[0] for p in pages])
    assert np.array_equal(np.sort(seen), np.sort(keys))  # every row once
    first_page_of = {}
    for i, (k, v, s) in enumerate(pages):
        assert 0 < len(k) <= 40 and np.all(np.diff(k) > 0)
        assert v.shape == (len(k), 4) and s.shape == (len(k),)
        for p in np.unique(partition_of(k)).tolist():
            first_page_of.setdefault(p, i)
            assert first_page_of[p] == i, f"partition {p} split over pages"
    k, v, s = cl.dump()
    whole = dict(zip(k.tolist(), range(len(k))))
    for pk, pv, ps in pages:
        rows = [whole[x] for x in pk.tolist()]
        assert np.array_equal(pv, v[rows]) and np.array_equal(ps, s[rows])


def test_a_partition_bigger_than_the_page_goes_out_in_key_ranges(cluster_factory):
    c = cluster_factory(num_shards=1, dim=4)
    cl = c.client()
    cand = np.arange(200_000, dtype=np.int64)
    keys = cand[partition_of(cand) == 17][:50]  # 50 rows, all in partition 17
    cl.push(keys, np.ones((50, 4), np.float32), 0.5)
    pages = list(cl.dump_pages(max_bytes=8 * (8 + 4 * 4 + 4)))  # 8 rows a page
    assert [len(p[0]) for p in pages] == [8] * 6 + [2]
    assert np.array_equal(np.concatenate([p[0] for p in pages]), np.sort(keys))
    assert NUM_PARTITIONS == 4096


def test_dump_pages_holds_one_page_per_shard(loaded):
    _c, cl, keys = loaded
    it = iter(cl.dump_pages(max_bytes=1 << 20))  # one page per shard holds it all
    first = next(it)
    second = next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert len(first[0]) + len(second[0]) == len(keys)
    assert list(cl.dump_pages()) and Client.dump_pages.__doc__


def test_empty_table_dumps_empty(cluster_factory):
    cl = cluster_factory(num_shards=3, dim=4).client()
    k, v, s = cl.dump()
    assert k.shape == (0,) and v.shape == (0, 4) and s.shape == (0,)
    assert list(cl.dump_pages()) == []
