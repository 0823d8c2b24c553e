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


def test_the_stage_refuses_a_job_file_s_tables_at_its_own_boundary():
    from cpu_dist.common.config import CacheConfig, Config, JobConfig
    from cpu_dist.common.tables import CATEGORICAL_FEATURES, JobTables, TableConfig
    from gpu_cache import make_reader

    tables = JobTables((TableConfig("t", 8, CATEGORICAL_FEATURES),), source="job.toml")
    cfg = Config(job=JobConfig(1, 1), cache=CacheConfig(), tables=tables)
    with pytest.raises(ValueError, match=r"not the tables t of --config job\.toml"):
        make_reader(cfg, None, None, None, None)  # type: ignore[arg-type]
