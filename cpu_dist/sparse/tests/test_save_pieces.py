"""Save in pieces: while a large table is written, pulls keep being served (updates wait),
the file is the same as one written with nothing else going on, and the temporary file has
an unpredictable name that is never a planted link."""

import os
import threading
import time

import numpy as np
import pytest

from cpu_dist.sparse import Client, PSError, Server

from .conftest import TOKEN

DIM = 32


@pytest.fixture
def big_shard(tmp_path):
    """One shard of 2M rows with a checkpoint directory."""
    srv = Server(DIM, TOKEN, init_scale=0.1, seed=4, checkpoint_dir=str(tmp_path))
    srv.start()
    cl = Client([srv.address], TOKEN, DIM, timeout_s=60.0)
    n, batch = 2_000_000, 200_000
    grads = np.random.default_rng(0).standard_normal((batch, DIM)).astype(np.float32)
    for i in range(0, n, batch):
        cl.push(np.arange(i, i + batch, dtype=np.int64), grads, 0.1, "rowwise_adagrad")
    yield srv, cl, tmp_path
    srv.stop(5.0)


@pytest.mark.timeout(300)
def test_pulls_are_served_while_a_large_table_is_saved(big_shard):
    srv, cl, root = big_shard
    fast = Client([srv.address], TOKEN, DIM, timeout_s=0.5)  # a short client timeout
    keys = np.arange(0, 2_000_000, 997, dtype=np.int64)
    want = cl.pull(keys)
    saving, done = threading.Event(), threading.Event()
    result = []

    def save():
        saving.set()
        try:
            result.append(cl.save(["during.bin"], 7)[0])
        finally:
            done.set()

    t = threading.Thread(target=save)
    t.start()
    saving.wait(10)
    during = 0  # pulls that began and ended while the save ran
    started = time.monotonic()
    while not done.is_set():
        got = fast.pull(keys)  # raises DEADLINE_EXCEEDED if the save blocks it
        if not done.is_set():
            during += 1
        assert np.array_equal(got, want)
    took = time.monotonic() - started
    t.join(60)
    assert result and result[0]["rows"] == 2_000_000
    print(f"FIGURE save of 2M rows took {took:.2f} s; {during} pulls served during it")
    assert during >= 1, "the save ended before any pull could overlap it"
    quiet = cl.save(["quiet.bin"], 7)[0]
    assert quiet == result[0]
    assert (root / "during.bin").read_bytes() == (root / "quiet.bin").read_bytes()
    assert not [p for p in os.listdir(root) if ".tmp-" in p]


def test_a_push_during_a_save_lands_whole_before_or_after_it(cluster_factory, tmp_path):
    c = cluster_factory(num_shards=1, dim=4, checkpoint_dir=str(tmp_path))
    cl = c.client()
    k = np.arange(200_000, dtype=np.int64)
    cl.push(k, np.ones((200_000, 4), np.float32), 0.1)
    before = cl.pull(k)
    t = threading.Thread(target=lambda: cl.save(["a.bin"], 0))
    t.start()
    c.client().push(k, np.ones((200_000, 4), np.float32), 0.1)  # waits while the save writes
    t.join(60)
    after = cl.pull(k)
    assert cl.load(["a.bin"])[0]["rows"] == 200_000
    saved = cl.pull(k)
    assert np.array_equal(saved, before) or np.array_equal(saved, after)


def test_temp_file_is_unique_and_never_follows_a_planted_link(cluster_factory, tmp_path):
    c = cluster_factory(num_shards=1, dim=4, checkpoint_dir=str(tmp_path))
    cl = c.client()
    cl.push(np.arange(10, dtype=np.int64), np.ones((10, 4), np.float32), 0.1)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    # The name an older shard used for its temporary file: path + ".tmp-" + pid.
    (tmp_path / "step-1").mkdir()
    os.symlink(victim, tmp_path / "step-1" / f"shard.bin.tmp-{os.getpid()}")
    assert cl.save(["step-1/shard.bin"], 1)[0]["rows"] == 10
    assert victim.read_text() == "precious"
    assert not (tmp_path / "step-1" / "shard.bin").is_symlink()
    assert cl.load(["step-1/shard.bin"])[0]["rows"] == 10
    with pytest.raises(PSError, match="must be a relative path"):
        cl.save(["../escape.bin"], 1)
