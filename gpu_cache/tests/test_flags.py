"""The cache stage's flags: the seed's example line validates, unsupported settings stop."""

import pytest

from cpu_dist.common.flags import parse_args
from cpu_dist.common.validate import ConfigError, validate

pytestmark = pytest.mark.timeout(30)

SEED_LINE = [
    "--ps-type",
    "RDMA",
    "--read-mode",
    "bagpipe",
    "--optimization-prescan",
    "--optimization-cache-capacity",
    "8192",
    "--bagpipe-aggregation",
    "ps",
]


def test_seed_example_line_validates():
    cfg = validate(parse_args(SEED_LINE), 3)
    assert cfg.cache is not None
    assert (
        cfg.cache.prescan,
        cfg.cache.capacity_units,
        cfg.train.aggregation,
        cfg.job.ps_type,
    ) == (True, 8192, "ps", "RDMA")


def test_default_is_uncached():
    assert validate(parse_args([]), 3).cache is None


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--read-mode", "bagpipe", "--sparse-optimizer", "rowwise_adagrad"], "sgd only"),
        (["--optimization-prescan"], "needs --read-mode bagpipe"),
        (["--read-mode", "bagpipe", "--sparse-sync", "async"], "needs a synchronous --sparse-sync"),
        (
            ["--read-mode", "bagpipe", "--optimization-cache-capacity", "0"],
            "positive number of 64-row",
        ),
        (["--read-mode", "bagpipe", "--optimization-plan-window", "-1"], "plan-window"),
        (["--read-mode", "bagpipe", "--optimization-bypass-below", "1"], "bypass-below 1.0"),
        (["--read-mode", "bagpipe", "--optimization-bypass-below", "-0.5"], "must be in"),
    ],
)
def test_unsupported_settings_fail_at_start(argv, needle):
    with pytest.raises(ConfigError, match=needle):
        validate(parse_args(argv), 3)


def test_each_table_gets_a_cache_of_its_width_lr_and_share():
    from mpi4py import MPI

    from cpu_dist.common.config import CacheConfig, Config, JobConfig
    from cpu_dist.common.tables import JobTables, TableConfig
    from gpu_cache import make_readers

    tables = JobTables(
        (
            TableConfig("narrow", 4, ("cat_0",), lr=0.5),
            TableConfig("wide", 64, ("cat_1",), lr=0.25),
            TableConfig("own", 16, ("cat_2",), lr=0.125, cache_capacity=3),
        ),
        data_features=("cat_0", "cat_1", "cat_2"),
        source="job.toml",
    )
    cfg = Config(job=JobConfig(1, 1), cache=CacheConfig(capacity_units=100), tables=tables)
    readers, planner = make_readers(cfg, None, None, MPI.COMM_SELF, None, None)  # type: ignore[arg-type]
    assert list(readers) == ["narrow", "wide", "own"] and planner is not None
    assert {n: (r.dim, r.lr) for n, r in readers.items()} == {
        "narrow": (4, 0.5),
        "wide": (64, 0.25),
        "own": (16, 0.125),
    }
    # 100 units at --embedding-dim 64 (1638400 bytes) less own's 3 units of 16 floats (12288):
    # 1626112 bytes for 68 floats a row, 93 units of 64 rows each
    rows = {n: r.storage.capacity_rows for n, r in readers.items()}
    assert rows == {"narrow": 93 * 64, "wide": 93 * 64, "own": 3 * 64}
