"""SplitPull against a real in-process shard: the early part never includes a written row,
and the assembled rows equal one plain pull after the commit."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from cpu_dist.sparse import Client, Server
from cpu_dist.train.row_prefetch import SplitPull

pytestmark = pytest.mark.timeout(60)


def test_split_pull_reads_written_rows_after_the_commit():
    server = Server(4, "t", init_scale=0.1)
    server.start()
    try:
        client = Client([server.address], "t", 4)
        written = np.array([3, 5, 9], dtype=np.int64)
        unique = np.array([1, 3, 4, 9, 12], dtype=np.int64)
        with ThreadPoolExecutor(1) as pool:
            split = SplitPull(client, pool, unique, written, timeout_s=10)
            np.testing.assert_array_equal(unique[split.dependent], [3, 9])
            np.testing.assert_array_equal(unique[split.independent], [1, 4, 12])
            # "commit t" lands after the early pull started: the written rows change now.
            client.push(written, np.ones((3, 4), np.float32), 1.0)
            rows = split.finish()
        np.testing.assert_array_equal(rows, client.pull(unique))
        empty = SplitPull(client, ThreadPoolExecutor(1), unique, np.zeros(0, np.int64), 10)
        np.testing.assert_array_equal(empty.finish(), client.pull(unique))
    finally:
        server.stop(2)
