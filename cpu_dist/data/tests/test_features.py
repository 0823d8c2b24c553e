"""BatchFeatures, the one Batch -> KeyedJaggedTensor of the job, its evaluation and the
reference: the default job's fused keys feature-major, a job file's tables each feature's own
ids modulo its table's num_embeddings (synthetic and Criteo key layouts), and multi-hot and
weighted features from the batch's bags."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cpu_dist.common.config import Config
from cpu_dist.common.features import categorical_names
from cpu_dist.common.flags import parse_args
from cpu_dist.common.validate import validate
from cpu_dist.data import Batch, SyntheticCriteo, fuse_criteo_columns
from cpu_dist.data.batch import Bags
from cpu_dist.data.features import BatchFeatures

pytestmark = pytest.mark.timeout(30)

B = 6
NAMES = list(categorical_names(26))
SMALL = ["cat_0", "cat_1", "cat_2", "cat_3", "cat_4"]  # the table with num_embeddings 7
MODULO = 7


def config(*flags: str) -> Config:
    args = parse_args(["--worker-num", "1", "--embedding-dim", "4", "--arch-mlp-bot", "4", *flags])
    return validate(args, 2)


def tables_config(tmp_path: Path) -> Config:
    """Two tables: ``small`` (num_embeddings 7) serves cat_0..cat_4 and ``raw`` (ids as they
    are) the rest, features listed out of the data's order."""
    job = tmp_path / "job.toml"
    job.write_text(
        f'[[tables]]\nname = "raw"\ndim = 4\nfeatures = {json.dumps(NAMES[5:][::-1])}\n\n'
        f'[[tables]]\nname = "small"\ndim = 4\nnum_embeddings = {MODULO}\n'
        f"features = {json.dumps(SMALL[::-1])}\n"
    )
    return config("--config", str(job))


def values_of(kjt, key: str) -> np.ndarray:
    i = kjt.keys().index(key)
    start = kjt.offset_per_key()
    return kjt.values()[start[i] : start[i + 1]].numpy()


def lengths_of(kjt, key: str) -> np.ndarray:
    i = kjt.keys().index(key)
    return kjt.lengths()[i * kjt.stride() : (i + 1) * kjt.stride()].numpy()


def test_the_default_jobs_values_are_the_fused_keys_feature_major():
    cfg = config()
    assert cfg.tables.fused
    data = SyntheticCriteo(seed=3)
    batch = data.global_batch(0, B)
    kjt = BatchFeatures(cfg.tables, data.kind, data.offsets)(batch)
    assert kjt.keys() == NAMES and kjt.stride() == B
    assert kjt.values().dtype == torch.int64
    np.testing.assert_array_equal(kjt.values().numpy(), batch.keys.T.reshape(-1))
    assert kjt.lengths().tolist() == [1] * (26 * B)
    assert kjt.weights_or_none() is None
    # the fused keys themselves: feature f's lie in its own range (no two features share one)
    assert np.all(values_of(kjt, "cat_1") >= data.offsets[1])


def test_a_job_files_tables_get_each_features_own_ids_modulo_num_embeddings(tmp_path):
    cfg = tables_config(tmp_path)
    assert not cfg.tables.fused
    data = SyntheticCriteo(seed=3)
    batch = data.global_batch(2, B)
    features = BatchFeatures(cfg.tables, data.kind, data.offsets)
    kjt = features(batch)
    assert kjt.keys() == NAMES  # the data's order, whatever the tables'
    own = batch.keys - data.offsets[None, :]
    for f, name in enumerate(NAMES):
        want = own[:, f] % MODULO if name in SMALL else own[:, f]
        np.testing.assert_array_equal(values_of(kjt, name), want, err_msg=name)
    ids = own.T.copy()  # [F, B], feature-major
    ids[:5] %= MODULO
    np.testing.assert_array_equal(features.ids(batch), ids)
    assert own[:, 5:].max() >= MODULO  # the raw table really keeps ids the modulo would fold


def test_criteo_layout_ids_are_the_raw_values(tmp_path):
    cfg = tables_config(tmp_path)
    raw = np.random.default_rng(0).integers(0, 2**32, (B, 26), dtype=np.int64)
    keys = fuse_criteo_columns(raw, [2**32] * 26)
    batch = Batch(dense=np.zeros((B, 13), np.float32), keys=keys, labels=np.zeros(B, np.float32))
    kjt = BatchFeatures(cfg.tables, "criteo")(batch)
    for f, name in enumerate(NAMES):
        want = raw[:, f] % MODULO if name in SMALL else raw[:, f]
        np.testing.assert_array_equal(values_of(kjt, name), want, err_msg=name)
    # the default job keeps the fused keys (the feature in the high bits)
    fused = BatchFeatures(config().tables, "criteo")(batch)
    np.testing.assert_array_equal(fused.values().numpy(), keys.T.reshape(-1))


def _bagged_batch(data: SyntheticCriteo, weighted: bool) -> Batch:
    """A one-hot batch of ``data`` with cat_2 multi-hot (an empty bag included) and, when
    ``weighted``, cat_7's one-hot ids weighted."""
    batch = data.global_batch(0, B)
    lengths = np.array([2, 0, 3, 1, 1, 4], np.int64)
    values = np.arange(100, 100 + int(lengths.sum()), dtype=np.int64) * 3
    bags = {
        "cat_2": Bags(
            lengths=lengths,
            values=values,
            weights=np.linspace(0.5, 2.0, len(values), dtype=np.float32) if weighted else None,
        )
    }
    if weighted:
        own = batch.keys[:, 7] - data.offsets[7]
        bags["cat_7"] = Bags(
            lengths=np.ones(B, np.int64),
            values=own.astype(np.int64),
            weights=np.full(B, 0.25, np.float32),
        )
    return Batch(dense=batch.dense, keys=batch.keys, labels=batch.labels, bags=bags)


def test_bags_give_their_own_ids_modulo_the_table_and_their_lengths(tmp_path):
    cfg = tables_config(tmp_path)
    data = SyntheticCriteo(seed=3)
    batch = _bagged_batch(data, weighted=False)
    kjt = BatchFeatures(cfg.tables, data.kind, data.offsets)(batch)
    bag = batch.bags["cat_2"]
    assert kjt.keys() == NAMES
    np.testing.assert_array_equal(lengths_of(kjt, "cat_2"), bag.lengths)
    np.testing.assert_array_equal(values_of(kjt, "cat_2"), bag.values % MODULO)  # small's
    assert kjt.weights_or_none() is None
    own = batch.keys - data.offsets[None, :]
    for f in (0, 3, 9):  # the one-hot features around it: one id each, as without bags
        np.testing.assert_array_equal(lengths_of(kjt, NAMES[f]), np.ones(B))
        want = own[:, f] % MODULO if NAMES[f] in SMALL else own[:, f]
        np.testing.assert_array_equal(values_of(kjt, NAMES[f]), want)
    assert len(kjt.values()) == 25 * B + int(bag.lengths.sum())


def test_weights_come_from_the_bags_and_are_one_for_every_other_id(tmp_path):
    cfg = tables_config(tmp_path)
    data = SyntheticCriteo(seed=3)
    batch = _bagged_batch(data, weighted=True)
    kjt = BatchFeatures(cfg.tables, data.kind, data.offsets)(batch)
    weights = kjt.weights_or_none()
    assert weights is not None and weights.dtype == torch.float32
    assert len(weights) == len(kjt.values())
    start = kjt.offset_per_key()

    def weights_of(name: str) -> np.ndarray:
        i = NAMES.index(name)
        return weights[start[i] : start[i + 1]].numpy()

    np.testing.assert_array_equal(weights_of("cat_2"), batch.bags["cat_2"].weights)
    np.testing.assert_array_equal(weights_of("cat_7"), np.full(B, 0.25, np.float32))
    np.testing.assert_array_equal(weights_of("cat_0"), np.ones(B, np.float32))
    np.testing.assert_array_equal(weights_of("cat_25"), np.ones(B, np.float32))
    # a weighted one-hot feature's ids are its bag's, the same as its one-hot ids here
    np.testing.assert_array_equal(values_of(kjt, "cat_7"), batch.keys[:, 7] - data.offsets[7])


def test_the_synthetic_datas_own_bags_become_the_features(tmp_path):
    cfg = tables_config(tmp_path)
    data = SyntheticCriteo(seed=3, bags={"cat_4": (0, 5), "cat_20": (1, 3)}, weights=["cat_20"])
    batch = data.global_batch(1, B)
    kjt = BatchFeatures(cfg.tables, data.kind, data.offsets)(batch)
    for name in ("cat_4", "cat_20"):
        bag = batch.bags[name]
        np.testing.assert_array_equal(lengths_of(kjt, name), bag.lengths)
        want = bag.values % MODULO if name in SMALL else bag.values
        np.testing.assert_array_equal(values_of(kjt, name), want, err_msg=name)


def test_bags_of_a_feature_no_table_serves_are_refused(tmp_path):
    cfg = tables_config(tmp_path)
    data = SyntheticCriteo(seed=3)
    batch = data.global_batch(0, B)
    odd = Batch(
        dense=batch.dense,
        keys=batch.keys,
        labels=batch.labels,
        bags={"cat_99": Bags(lengths=np.ones(B, np.int64), values=np.zeros(B, np.int64))},
    )
    with pytest.raises(KeyError, match="bags of feature 'cat_99', which no table of the job"):
        BatchFeatures(cfg.tables, data.kind, data.offsets)(odd)


def test_a_fused_jobs_bags_are_fused_keys_of_their_feature(tmp_path):
    """A job file with ``[data] bags`` and no ``[[tables]]`` keeps the one fused table: a
    bag's ids must become its feature's fused keys (``offset[f] + id``), as its one-hot ids
    are, or they share rows with other features."""
    job = tmp_path / "job.toml"
    job.write_text("[data]\nbags = { cat_3 = [1, 3] }\n")
    cfg = config("--config", str(job))
    assert cfg.tables.fused and cfg.data.bags == (("cat_3", 1, 3),)
    data = SyntheticCriteo(seed=3, bags={"cat_3": (1, 3)})
    batch = data.global_batch(0, B)
    kjt = BatchFeatures(cfg.tables, data.kind, data.offsets)(batch)
    np.testing.assert_array_equal(
        values_of(kjt, "cat_3"), batch.bags["cat_3"].values + data.offsets[3]
    )
