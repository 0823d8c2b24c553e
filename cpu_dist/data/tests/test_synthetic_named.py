"""Synthetic data for any job file's features (``SyntheticCriteo(features=...)``, a job file's
``[data] kind = "synthetic"``): ``cat_0 ... cat_25`` stay the stream's bit for bit, any other
name is a Zipf stream of its own, deterministic in (seed, name), W-invariant, within its
cardinality; ``[data] dense = N`` and ``[data] cardinalities`` as the job file gives them."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from cpu_dist.common.features import categorical_names
from cpu_dist.common.flags import parse_args
from cpu_dist.common.validate import ConfigError, validate
from cpu_dist.data import SyntheticCriteo
from cpu_dist.data.factory import dataset_for

pytestmark = pytest.mark.timeout(60)

# sha256 of the batches below as the generator made them before features of other names
# existed (dcd30ea): the default job's data, and one with bags and weights.  Recorded once
# from that generator's output (it no longer exists to compare with), so that any change to
# the default job's bits fails here.
BEFORE = {
    "default": "e3297e4fd4fd533cc39709c2f9be7cc2a7fce1f5b0a1a4d4c4002a27a10545df",
    "bags": "b858604b84d12ed041b6a6658453f9fc2a470ef29aa4651262b8d0877724c6cf",
}
BAGS = {"seed": 5, "bags": {"cat_0": (0, 4), "cat_9": (1, 6)}, "weights": ["cat_0", "cat_18"]}


def digest(data: SyntheticCriteo) -> str:
    h = hashlib.sha256()
    for split, step in (("train", 0), ("train", 7), ("eval", 0), ("test", 1)):
        b = data.global_batch(step, 128, split)
        for a in (b.dense, b.keys, b.labels):
            h.update(np.ascontiguousarray(a).tobytes())
        for name in sorted(b.bags):
            bag = b.bags[name]
            for a in (bag.lengths, bag.values, bag.weights):
                if a is not None:
                    h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def test_the_default_job_and_cat_features_named_in_order_keep_their_bits():
    assert digest(SyntheticCriteo()) == BEFORE["default"]
    assert digest(SyntheticCriteo(**BAGS)) == BEFORE["bags"]
    assert digest(SyntheticCriteo(**BAGS, features=categorical_names())) == BEFORE["bags"]
    cfg = validate(parse_args([]), 3)  # the default job's data, as the launcher makes it
    assert digest(dataset_for(cfg.data, 0)) == BEFORE["default"]


def test_a_named_feature_is_its_own_stream_whatever_else_is_named():
    a = SyntheticCriteo(
        seed=1,
        features=["cat_2", "user", "hist", "tags"],
        named_cardinalities={"user": 1000, "tags": 50},
        bags={"hist": (0, 4)},
        weights=["tags"],
    )
    b = SyntheticCriteo(seed=1, features=["hist", "zz"], bags={"hist": (0, 4)})
    x, y = a.global_batch(3, 64), b.global_batch(3, 64)
    np.testing.assert_array_equal(x.bags["hist"].values, y.bags["hist"].values)
    np.testing.assert_array_equal(x.bags["hist"].lengths, y.bags["hist"].lengths)
    assert x.bags["hist"].lengths.max() <= 4
    # a cat_k column is the default stream's column
    np.testing.assert_array_equal(
        x.keys[:, 0], SyntheticCriteo(seed=1).global_batch(3, 64).keys[:, 2]
    )
    ids = x.keys - a.offsets[None, :]
    assert 0 <= ids[:, 1].min() and ids[:, 1].max() < 1000  # its cardinality
    assert x.bags["tags"].values.max() < 50 and x.bags["tags"].weights is not None
    assert len(np.unique(ids[:, 1])) < 64  # Zipf: hot ids repeat
    # deterministic in (seed, name): another seed, another stream
    other = SyntheticCriteo(seed=2, features=["hist", "zz"], bags={"hist": (0, 4)})
    assert not np.array_equal(other.global_batch(3, 64).bags["hist"].values, y.bags["hist"].values)
    # W-invariant: the workers' shares are the global batch, cut
    shares = [a.worker_batch(3, 64, r, 4) for r in range(4)]
    np.testing.assert_array_equal(np.concatenate([s.keys for s in shares]), x.keys)
    np.testing.assert_array_equal(np.concatenate([s.labels for s in shares]), x.labels)


OWN = """
[[tables]]
name = "users"
features = ["user"]
num_embeddings = 5000

[[tables]]
name = "items"
features = ["hist", "tags"]

[data]
kind = "synthetic"
dense = 4
"""


def test_a_job_file_s_own_names_become_the_data_s_features(tmp_path, capsys):
    path = tmp_path / "job.toml"

    def config(text: str):
        path.write_text(text)
        try:
            return validate(parse_args(["--config", str(path)]), 3)
        except SystemExit:  # the job file's own shape: refused while the flags are parsed
            raise ConfigError(capsys.readouterr().err) from None

    cfg = config(OWN + "cardinalities = { tags = 300 }\n")
    assert cfg.tables.data_features == cfg.data.features == ("user", "hist", "tags")
    assert cfg.data.num_dense == 4
    assert cfg.data.cardinalities == (("hist", 100_000), ("tags", 300), ("user", 5000))
    data = dataset_for(cfg.data, cfg.train.seed)
    assert data.num_dense == 4 and data.sparse_names == ("user", "hist", "tags")
    assert data.global_batch(0, 8).dense.shape == (8, 4)
    for text, words in [
        (OWN + "cardinalities = { cat_3 = 9 }\n", "'cat_3': keeps the synthetic stream's own"),
        (OWN + "cardinalities = { nope = 9 }\n", "'nope' is in no table of the job"),
        (OWN + "cardinalities = { tags = 0 }\n", "'tags': 0: expected an integer >= 1"),
        (OWN + "cardinalities = { tags = 99999999 }\n", "over the synthetic stream's 16777216"),
        (OWN.replace("dense = 4", "dense = -1"), "dense -1: must be in 0..4096"),
        (
            OWN.replace('"synthetic"', '"criteo"'),
            "'user' is not a feature of the data .--data criteo",
        ),
    ]:
        with pytest.raises(ConfigError, match=words):
            config(text)
    cats = ", ".join(f'"cat_{i}"' for i in range(26))
    path.write_text(
        f'[[tables]]\nname = "t"\nfeatures = [{cats}]\n\n[data]\nkind = "criteo"\ndense = 4\n'
    )
    with pytest.raises(ConfigError, match=r"\[data\] dense: shapes the synthetic stream"):
        validate(parse_args(["--config", str(path), "--data-path", __file__]), 3)
