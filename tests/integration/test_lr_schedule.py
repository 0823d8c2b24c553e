"""Learning-rate warmup and decay under real jobs: every rate (the dense optimizer's and each
table's) follows ``cpu_dist/common/schedule.py`` in the workers' optimizer, in the commits the
shards apply, in the rows the catch-up and the cache bring forward on the worker, and in
``python -m cpu_dist.reference``; a resumed job continues the schedule.

Over 8 steps: counts 1 and 2 warm up, 3 trains at the base rates, 4..6 decay and 7..8 keep
the last decayed rate.  Every feature kind and every optimizer (the three tables of widths 4,
16 and 64; the cache's run has SGD tables, which is what the cache mirrors)."""

from __future__ import annotations

import numpy as np
import pytest

from .job_files import three_tables
from .launch import assert_dumps_close, assert_dumps_equal, cli_reference, train

pytestmark = pytest.mark.timeout(900)

STEPS, BATCH = 8, 24
SCHEDULE = ["--lr-warmup-steps", "3", "--lr-decay-start", "4", "--lr-decay-steps", "3"]
DATA = """
[data]
kind = "synthetic"
bags = { cat_0 = [0, 4], cat_9 = [1, 6], cat_17 = [2, 5] }
weights = ["cat_0"]
"""
KEYS = {"narrow": {"lr": 0.2}, "mid": {"lr": 0.05, "pooling": "mean"}, "wide": {"eps": 1e-6}}
SGD = {name: {**keys, "optimizer": "sgd"} for name, keys in KEYS.items()}
del SGD["wide"]["eps"]  # (eps is Adagrad's only)


def job_flags(tmp_path, keys, *extra: str) -> list[str]:
    path = tmp_path / "tables.toml"
    path.write_text(three_tables(**keys) + DATA)
    return ["--config", str(path), "--batch-size", str(BATCH), "--max_step", str(STEPS), *extra]


@pytest.mark.parametrize(
    "mode",
    [
        [],  # pipelined, ps aggregation: early pulls
        ["--aggregation", "collective"],  # reads caught up on the worker
        ["--read-mode", "bagpipe", "--optimization-prescan", "--optimization-cache-capacity", "16"],
    ],
    ids=["pipelined", "catch-up", "cache"],
)
def test_a_scheduled_job_equals_the_reference(tmp_path, mode):
    keys = SGD if "bagpipe" in mode else KEYS
    args = job_flags(tmp_path, keys, *SCHEDULE, *mode)
    want = cli_reference(args, tmp_path / "reference.npz")
    env = {"GPU_CACHE_VERIFY": "1"} if "bagpipe" in mode else None
    got = train(tmp_path, "scheduled", 2, 2, args, env=env)
    assert_dumps_close(got, want, 1e-4, f"scheduled W=2 P=2 {' '.join(mode) or 'pipelined'}")
    # the schedule is in effect: the same job at constant rates ends elsewhere
    constant = cli_reference(job_flags(tmp_path, keys, *mode), tmp_path / "constant.npz")
    moved = [k for k in want if not np.allclose(want[k], constant[k], rtol=1e-3, atol=1e-6)]
    assert any(k.startswith("dense/") for k in moved) and any(
        k.startswith("table/") for k in moved
    ), moved


def test_a_resumed_job_continues_the_schedule(tmp_path):
    """Stopped after step 4 (warmup done, decay begun), resumed to step 8: the same bits as
    the run never stopped."""
    d = tmp_path / "ck"
    args = job_flags(tmp_path, KEYS, *SCHEDULE, "--aggregation", "collective")
    whole = train(tmp_path, "whole", 2, 1, args)
    first = [*args, "--max_step", "5", "--checkpoint-dir", str(d), "--checkpoint-every", "5"]
    train(tmp_path, "first", 2, 1, first)
    got = train(tmp_path, "resumed", 2, 1, [*args, "--resume", "--checkpoint-dir", str(d)])
    assert_dumps_equal(got, whole, "scheduled, resumed")
