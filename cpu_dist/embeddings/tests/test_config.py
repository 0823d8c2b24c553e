"""EmbeddingBagConfig: TorchRec's fields in TorchRec's order, a job file's keys with the job
file's defaults and checks, and the conversions both ways."""

from __future__ import annotations

import dataclasses
import enum
import math

import pytest

from cpu_dist.common.contracts import default_init_scale
from cpu_dist.common.features import CATEGORICAL_FEATURES
from cpu_dist.common.job_file import TABLE_KEYS, TableDefaults, job_tables, read_job_file
from cpu_dist.common.tables import DEFAULT_EPS, DEFAULT_LR, OPTIMIZERS, TableConfig
from cpu_dist.embeddings import DataType, EmbeddingBagConfig, PoolingType
from cpu_dist.embeddings.config import configs_of, job_tables_of

pytestmark = pytest.mark.timeout(60)

# torchrec/modules/embedding_configs.py: BaseEmbeddingConfig's fields we keep, then pooling.
TORCHREC_ORDER = [
    "num_embeddings",
    "embedding_dim",
    "name",
    "data_type",
    "feature_names",
    "weight_init_max",
    "weight_init_min",
    "pooling",
]


def test_torchrec_fields_come_first_in_torchrec_order_then_the_job_file_keys():
    names = [f.name for f in dataclasses.fields(EmbeddingBagConfig)]
    assert names[: len(TORCHREC_ORDER)] == TORCHREC_ORDER
    ours = set(names[len(TORCHREC_ORDER) :])
    # every [[tables]] key has a field (under TorchRec's name where TorchRec has one), but
    # cache_capacity: it sizes a job's worker-side cache of the table, not the table
    renamed = {"dim": "embedding_dim", "features": "feature_names"}
    table_keys = set(TABLE_KEYS) - {"cache_capacity"}
    assert {renamed.get(k, k) for k in table_keys} <= set(names)
    assert "cache_capacity" not in names
    assert ours == {"optimizer", "lr", "init_scale", "seed", "admit_after", "expire_after", "eps"}


def test_positional_construction_as_torchrec_and_the_job_files_defaults():
    c = EmbeddingBagConfig(1000, 16, "t", DataType.FP32, ["a", "b"])
    assert (c.num_embeddings, c.embedding_dim, c.name, c.feature_names) == (
        1000,
        16,
        "t",
        ("a", "b"),
    )
    assert c.pooling is PoolingType.SUM and c.data_type is DataType.FP32
    assert c.optimizer == OPTIMIZERS[0] == TableConfig.optimizer
    assert c.lr == DEFAULT_LR and c.eps == DEFAULT_EPS
    assert (
        c.init_scale
        == default_init_scale(16)
        == c.get_weight_init_max()
        == -c.get_weight_init_min()
    )
    assert (c.admit_after, c.expire_after, c.seed) == (0, 0, None)
    assert c.num_features() == 2


@pytest.mark.parametrize(
    ("given", "expected"),
    [("sum", PoolingType.SUM), ("MEAN", PoolingType.MEAN), (PoolingType.MEAN, PoolingType.MEAN)],
)
def test_pooling_takes_the_enum_or_the_strings(given, expected):
    assert EmbeddingBagConfig(0, 4, "t", feature_names=["f"], pooling=given).pooling is expected


def test_pooling_takes_torchrecs_own_enum_by_value():
    class TorchRecPooling(enum.Enum):  # torchrec.modules.embedding_configs.PoolingType's values
        SUM = "SUM"
        MEAN = "MEAN"
        NONE = "NONE"

    c = EmbeddingBagConfig(0, 4, "t", feature_names=["f"], pooling=TorchRecPooling.MEAN)
    assert c.pooling is PoolingType.MEAN
    with pytest.raises(ValueError, match=r"'t'.*pooling 'NONE'"):
        EmbeddingBagConfig(0, 4, "t", feature_names=["f"], pooling=TorchRecPooling.NONE)


def test_weight_init_range_maps_onto_init_scale_and_must_be_symmetric():
    c = EmbeddingBagConfig(
        0, 4, "t", feature_names=["f"], weight_init_max=0.1, weight_init_min=-0.1
    )
    assert c.init_scale == 0.1
    with pytest.raises(ValueError, match=r"'t': weight_init_min 0.0: must be -weight_init_max"):
        EmbeddingBagConfig(0, 4, "t", feature_names=["f"], weight_init_max=0.1, weight_init_min=0.0)
    with pytest.raises(ValueError, match=r"'t': weight_init_max and weight_init_min: give both"):
        EmbeddingBagConfig(0, 4, "t", feature_names=["f"], weight_init_max=0.1)
    with pytest.raises(ValueError, match=r"'t': init_scale 0.2 and weight_init_max 0.1 disagree"):
        EmbeddingBagConfig(
            0,
            4,
            "t",
            feature_names=["f"],
            weight_init_max=0.1,
            weight_init_min=-0.1,
            init_scale=0.2,
        )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_embeddings": -1}, r"'tab': num_embeddings -1: must be in 0\.\."),
        ({"embedding_dim": 0}, r"'tab': embedding_dim 0: must be in 1\.\.65536"),
        ({"embedding_dim": 2.0}, r"'tab': embedding_dim 2.0: expected an integer"),
        ({"name": ""}, r"EmbeddingBagConfig: name '': must be 1-128"),
        ({"name": ".hidden"}, r"name '.hidden': must be"),
        ({"feature_names": []}, r"'tab': feature_names: empty"),
        ({"feature_names": ["a", "a"]}, r"'tab': feature_names: 'a' listed twice"),
        ({"feature_names": "a"}, r"'tab': feature_names 'a': expected a list"),
        ({"pooling": "max"}, r"'tab': pooling 'max': must be one of"),
        ({"optimizer": "adam"}, r"'tab': optimizer 'adam': must be one of 'sgd'"),
        ({"lr": 0.0}, r"'tab': lr 0.0: must be a positive finite number"),
        ({"lr": math.inf}, r"'tab': lr inf: must be a positive"),
        ({"init_scale": -1.0}, r"'tab': init_scale -1.0: must be a positive"),
        ({"eps": 1e-6}, r"'tab': eps: only the adagrad optimizer reads it \(this table's is sgd\)"),
        ({"admit_after": -1}, r"'tab': admit_after -1: must be in 0\.\.4294967295"),
        ({"expire_after": 2**32}, r"'tab': expire_after 4294967296: must be in"),
        ({"data_type": DataType.FP16}, r"'tab': data_type .*only DataType.FP32"),
        ({"seed": -1}, r"'tab': seed -1: must be in"),
    ],
)
def test_bad_values_name_the_table_and_the_field(change, message):
    args = {"num_embeddings": 10, "embedding_dim": 4, "name": "tab", "feature_names": ["f"]}
    with pytest.raises(ValueError, match=message):
        EmbeddingBagConfig(**{**args, **change})


def test_eps_is_adagrads():
    c = EmbeddingBagConfig(0, 4, "t", feature_names=["f"], optimizer="adagrad", eps=1e-4)
    assert c.eps == 1e-4 and c.spec()["eps"] == 1e-4


def test_round_trip_through_table_config_and_spec():
    c = EmbeddingBagConfig(
        50,
        8,
        "items",
        feature_names=["x", "y"],
        pooling="mean",
        optimizer="adagrad",
        lr=0.25,
        init_scale=0.05,
        seed=7,
        admit_after=2,
        expire_after=9,
        eps=1e-5,
    )
    t = c.to_table_config()
    assert t == TableConfig(
        name="items",
        dim=8,
        features=("x", "y"),
        num_embeddings=50,
        optimizer="adagrad",
        lr=0.25,
        init_scale=0.05,
        admit_after=2,
        expire_after=9,
        eps=1e-5,
        pooling="mean",
    )
    assert EmbeddingBagConfig.from_table_config(t, seed=7) == c
    assert c.spec(seed=123) == t.spec(7)  # the config's own seed wins
    assert EmbeddingBagConfig.from_table_config(t).spec(3) == t.spec(3)


def test_a_job_files_tables_map_onto_configs_and_back(tmp_path):
    rest = ", ".join(f'"{f}"' for f in CATEGORICAL_FEATURES[2:])
    path = tmp_path / "job.toml"
    path.write_text(
        "[[tables]]\n"
        'name = "shared"\ndim = 16\nfeatures = ["cat_0", "cat_1"]\npooling = "mean"\n'
        'optimizer = "rowwise_adagrad"\nnum_embeddings = 1000\n'
        "[[tables]]\n"
        f'name = "rest"\nfeatures = [{rest}]\noptimizer = "adagrad"\neps = 1e-6\nlr = 0.1\n'
    )
    defaults = TableDefaults(
        dim=4, optimizer="sgd", lr=0.5, init_scale=None, admit_after=0, expire_after=0
    )
    tables = job_tables(read_job_file(path), defaults, CATEGORICAL_FEATURES, "synthetic")
    assert tables is not None
    configs = configs_of(tables, seed=5)
    assert configs[0] == EmbeddingBagConfig(
        1000,
        16,
        "shared",
        feature_names=["cat_0", "cat_1"],
        pooling=PoolingType.MEAN,
        optimizer="rowwise_adagrad",
        seed=5,
    )
    assert configs[1] == EmbeddingBagConfig(
        0,
        4,
        "rest",
        feature_names=CATEGORICAL_FEATURES[2:],
        optimizer="adagrad",
        eps=1e-6,
        lr=0.1,
        seed=5,
    )
    back = job_tables_of(configs, CATEGORICAL_FEATURES)
    assert back.tables == tables.tables
    assert back.specs(5) == [c.spec() for c in configs]


def test_job_tables_of_refuses_a_feature_in_two_tables():
    a = EmbeddingBagConfig(0, 4, "a", feature_names=["f"])
    b = EmbeddingBagConfig(0, 4, "b", feature_names=["f"])
    with pytest.raises(ValueError, match=r"feature 'f' is in table 'a' and in 'b'"):
        job_tables_of([a, b])
