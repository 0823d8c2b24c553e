"""A TorchRec ``EmbeddingBagConfig`` (here a stand-in with TorchRec's fields; torchrec's own
where installed) takes our fields from the job building the model, and says so."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from cpu_dist.common.config import DEFAULT_LR
from cpu_dist.embeddings import EmbeddingBagCollection, EmbeddingBagConfig
from cpu_dist.embeddings.foreign import job_table_defaults

pytestmark = pytest.mark.timeout(60)


@dataclass
class TorchRecConfig:
    """TorchRec's EmbeddingBagConfig's fields (no optimizer, no lr)."""

    num_embeddings: int
    embedding_dim: int
    name: str
    feature_names: list[str] = field(default_factory=list)


def table(name: str = "t") -> TorchRecConfig:
    return TorchRecConfig(100, 4, name, ["f"])


def test_outside_a_job_a_torchrec_config_takes_our_defaults():
    (c,) = EmbeddingBagCollection([table()]).embedding_bag_configs()
    assert (c.optimizer, c.lr) == ("sgd", DEFAULT_LR)


def test_in_a_job_the_defaults_are_the_jobs_and_said():
    with job_table_defaults("rowwise_adagrad", 0.05) as notes:
        (c,) = EmbeddingBagCollection([table()]).embedding_bag_configs()
    assert (c.optimizer, c.lr) == ("rowwise_adagrad", 0.05)
    assert notes == [
        "table 't' is a TorchRec EmbeddingBagConfig: optimizer rowwise_adagrad, lr 0.05 from "
        "--sparse-optimizer and --sparse-lr"
    ]


def test_a_job_table_of_the_same_name_gives_its_own_fields():
    job = EmbeddingBagConfig(
        100, 4, "t", feature_names=["f"], optimizer="adagrad", lr=0.02, eps=1e-6, admit_after=2
    )
    with job_table_defaults("sgd", 0.5, [job]) as notes:
        (c,) = EmbeddingBagCollection([table()]).embedding_bag_configs()
    assert c == job
    assert notes == [
        "table 't' is a TorchRec EmbeddingBagConfig: optimizer adagrad, lr 0.02 from the job's "
        "table 't'"
    ]
