"""``sparse_mode`` reads the table of modes (``cpu_dist.common.modes.MODES``): over a grid of
every setting the choice depends on, it picks what the rules written out as code picked before
the table existed, every row is reached, and a patched row changes the choice."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from cpu_dist.common import modes
from cpu_dist.common.config import (
    CacheConfig,
    ClientConfig,
    Config,
    JobConfig,
    ShardStorageConfig,
    TrainConfig,
)
from cpu_dist.common.features import CATEGORICAL_FEATURES
from cpu_dist.common.tables import JobTables
from cpu_dist.common.tables import TableConfig as EmbeddingTable
from cpu_dist.train.pipelines import sparse_mode

pytestmark = pytest.mark.timeout(60)


def before_the_table(cfg: Config) -> str:
    """``choose.sparse_mode`` as it was written before the table (commit b24a09e), verbatim."""
    t, tables = cfg.train, cfg.tables.tables
    expiry = bool(cfg.storage.expire_after) or any(x.expire_after for x in tables)
    rules = bool(cfg.storage.admit_after) or any(x.has_rules for x in tables)
    strategy = "direct"
    if cfg.cache is not None:
        strategy = "cache"
    elif (
        t.sparse_sync in ("pipelined", "async")
        and t.aggregation == "collective"
        and not (rules or expiry)
    ):
        strategy = "catch_up"
    elif (
        cfg.job.worker_num == 1
        and t.sparse_sync == "pipelined"
        and t.aggregation == "ps"
        and not (rules or expiry)
        and cfg.client.compression == "none"
        and all(x.optimizer == "sgd" for x in tables)
    ):
        strategy = "sole_writer"
    elif t.sparse_sync == "pipelined" and not expiry:
        strategy = "early_pull"
    elif t.sparse_sync == "async" and t.max_staleness > 0:
        strategy = "async_prefetch"
    return strategy


def two_tables(optimizer: str, admit: int, expire: int) -> JobTables:
    """A job file's two tables; the rules and the optimizer on the second only."""
    half = len(CATEGORICAL_FEATURES) // 2
    return JobTables(
        (
            EmbeddingTable("a", 4, CATEGORICAL_FEATURES[:half]),
            EmbeddingTable(
                "b",
                8,
                CATEGORICAL_FEATURES[half:],
                optimizer=optimizer,
                admit_after=admit,
                expire_after=expire,
            ),
        ),
        data_features=CATEGORICAL_FEATURES,
        source="job.toml",
    )


def grid() -> list[Config]:
    """Every combination of what the choice reads, flag-declared and job-file tables alike."""
    out = []
    for (
        sync,
        agg,
        workers,
        k,
        comp,
        opt,
        admit,
        expire,
        cached,
        external,
        job_file,
    ) in itertools.product(
        ("pipelined", "barrier", "async"),
        ("ps", "collective"),
        (1, 2),
        (0, 2),
        ("none", "fp16"),
        ("sgd", "adagrad"),
        (0, 1, 2),
        (0, 3),
        (False, True),
        (False, True),
        (False, True),
    ):
        train = TrainConfig(
            sparse_sync=sync, aggregation=agg, max_staleness=k, sparse_optimizer=opt
        )
        job = JobConfig(workers, 0, ps_list=("h:1",)) if external else JobConfig(workers, 1)
        common = dict(
            job=job,
            train=train,
            client=ClientConfig(compression=comp),  # type: ignore[arg-type]
            cache=CacheConfig() if cached else None,
        )
        if job_file:
            out.append(Config(**common, tables=two_tables(opt, admit, expire)))  # type: ignore[arg-type]
        else:
            storage = ShardStorageConfig(admit_after=admit, expire_after=expire)
            out.append(Config(**common, storage=storage))  # type: ignore[arg-type]
    return out


GRID = grid()


def test_every_config_of_the_grid_gets_the_mode_it_got_before_the_table():
    wrong = [
        (cfg, sparse_mode(cfg).strategy, before_the_table(cfg))
        for cfg in GRID
        if sparse_mode(cfg).strategy != before_the_table(cfg)
    ]
    assert not wrong, f"{len(wrong)} of {len(GRID)} differ, first: {wrong[0]}"


@pytest.mark.parametrize("row", modes.MODES, ids=lambda m: m.strategy)
def test_each_row_is_reached_and_gives_its_committer_settings(row):
    chosen = [sparse_mode(cfg) for cfg in GRID if before_the_table(cfg) == row.strategy]
    assert chosen, f"no configuration of the grid chooses {row.strategy}"
    assert {(m.exchange_ids, m.background) for m in chosen} == {(row.exchange_ids, row.background)}


def test_a_patched_row_changes_the_choice(monkeypatch):
    """The sole writer's row made to accept compression: a one-worker fp16 job now gets it."""
    cfg = Config(job=JobConfig(1, 1), client=ClientConfig(compression="fp16"))
    assert sparse_mode(cfg).strategy == "early_pull"
    rows = list(modes.MODES)
    i = next(i for i, m in enumerate(rows) if m.strategy == "sole_writer")
    requires = tuple(r for r in rows[i].requires if r.fact != "compression")
    rows[i] = dataclasses.replace(rows[i], requires=requires)
    monkeypatch.setattr(modes, "MODES", tuple(rows))
    assert sparse_mode(cfg).strategy == "sole_writer"
