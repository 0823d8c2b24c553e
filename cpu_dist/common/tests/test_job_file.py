"""The job's tables (cpu_dist/common/tables.py) and the job file (``--config``,
cpu_dist/common/job_file.py): precedence, the ``[[tables]]`` keys and every refusal."""

from __future__ import annotations

import pytest

from cpu_dist.common.contracts import default_init_scale, table_salt
from cpu_dist.common.flags import parse_args
from cpu_dist.common.tables import CATEGORICAL_FEATURES, DENSE_FEATURES, JobTables, TableConfig
from cpu_dist.common.validate import validate

pytestmark = pytest.mark.timeout(30)


def test_every_job_without_a_file_has_the_one_fused_table_of_its_flags():
    args = parse_args(
        [
            "--embedding-dim",
            "16",
            "--sparse-optimizer",
            "rowwise_adagrad",
            "--sparse-lr",
            "0.25",
            "--ps-admit-after",
            "3",
            "--ps-expire-after",
            "7",
            "--seed",
            "5",
        ]
    )
    cfg = validate(args, 3)
    assert cfg.tables.fused and cfg.tables.names == ("embedding",)
    (t,) = cfg.tables.tables
    assert (t.dim, t.optimizer, t.lr, t.admit_after, t.expire_after) == (
        16,
        "rowwise_adagrad",
        0.25,
        3,
        7,
    )
    assert t.init_scale == default_init_scale(16) == cfg.model.init_scale
    assert t.features == CATEGORICAL_FEATURES and cfg.tables.table_of("cat_25") is t
    assert cfg.tables.columns("embedding") == tuple(range(26))
    assert cfg.tables.specs(cfg.train.seed) == [
        {
            "name": "embedding",
            "dim": 16,
            "optimizer": "rowwise_adagrad",
            "init_scale": default_init_scale(16),
            "seed": 5,
            "num_embeddings": 0,
            "admit_after": 3,
            "expire_after": 7,
            "eps": 0.0,
        }
    ]
    assert table_salt(t.name) == 0  # today's row_init and partition hash


def test_features_are_named_as_torchrec_names_criteo_s():
    assert CATEGORICAL_FEATURES == tuple(f"cat_{i}" for i in range(26))
    assert DENSE_FEATURES == tuple(f"int_{i}" for i in range(13))


def test_a_table_spec_sends_admission_one_as_off_and_eps_only_for_adagrad():
    sgd = TableConfig("a", 4, ("cat_0",), admit_after=1, eps=1e-3)
    ada = TableConfig("b", 4, ("cat_1",), optimizer="adagrad", eps=1e-3)
    assert sgd.spec(0)["admit_after"] == 0 and sgd.spec(0)["eps"] == 0.0
    assert ada.spec(0)["eps"] == 1e-3 and ada.init_scale == default_init_scale(4)


def test_job_tables_refuse_a_shared_feature_and_a_duplicate_name():
    a = TableConfig("a", 4, ("cat_0",))
    with pytest.raises(ValueError, match="'cat_0' is in table 'a' and in 'b'"):
        JobTables((a, TableConfig("b", 4, ("cat_0",))))
    with pytest.raises(ValueError, match="two tables are named 'a'"):
        JobTables((a, TableConfig("a", 4, ("cat_1",))))
    with pytest.raises(KeyError, match="no table named 'c'"):
        JobTables((a,)).by_name("c")
