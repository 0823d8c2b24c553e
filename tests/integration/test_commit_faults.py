"""The commit protocol when a rank is lost or the job closes with work in flight.

Real PS process (python -m cpu_dist.sparse.server), real client processes: a rank killed with
SIGKILL mid-protocol makes the others' waits fail within their timeout, never hang, and the
shard keeps serving.  (Closing with commits in flight: tests/mpi/test_commit_drain.py.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from cpu_dist.common.tokens import write_token_file
from cpu_dist.sparse import Client, row_init
from cpu_dist.testing.shards import standalone_shard, stop

pytestmark = pytest.mark.timeout(120)
DIM, TOKEN, SCALE = 4, "fault-token", 0.1


@pytest.fixture
def shard(tmp_path):
    token_file = tmp_path / "token"
    write_token_file(str(token_file), TOKEN)
    with standalone_shard(str(token_file), DIM, extra=["--init-scale", str(SCALE)]) as (addr, p):
        yield addr
        assert stop(p) == 0  # the shard survived the lost rank and stops cleanly


RANK1 = textwrap.dedent("""
    import sys, numpy as np
    from cpu_dist.sparse import Client
    cl = Client([sys.argv[1]], sys.argv[2], {dim})
    cl.commit(9, 0, 1, 2, np.array([5], np.int64), np.ones((1, {dim}), np.float32), 0.5)
    print("committed step 0", flush=True)
    sys.stdin.read()   # blocks until killed
""")


def test_lost_rank_gives_others_a_timeout_not_a_hang(shard):
    rank1 = subprocess.Popen(
        [sys.executable, "-c", RANK1.format(dim=DIM), shard, TOKEN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rank1.stdout.readline().strip() == "committed step 0"
        cl = Client([shard], TOKEN, DIM, timeout_s=10)
        keys, grads = np.array([5], np.int64), np.ones((1, DIM), np.float32)
        cl.commit(9, 0, 0, 2, keys, grads, 0.5)
        assert cl.wait_committed(9, 0, 10) == 0
        os.kill(rank1.pid, signal.SIGKILL)
        rank1.wait(10)
        cl.commit(9, 1, 0, 2, keys, grads, 0.5)  # rank 1 will never send step 1
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            cl.wait_committed(9, 1, 2.0)
        waited = time.monotonic() - t0
        assert 1.5 <= waited < 6.0, waited
        # The shard is still serving, and step 1 was not half-applied: row 5 holds step 0 only.
        expect = row_init(0, keys, DIM, SCALE) - 0.5 * 1.0
        np.testing.assert_allclose(cl.pull(keys), expect, rtol=1e-6)
        assert cl.committed_step(9) == 0
    finally:
        rank1.kill()
        rank1.wait(10)
