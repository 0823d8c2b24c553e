"""The data flags: --data criteo-bin, the hashing flags, --epochs, --shuffle."""

from pathlib import Path

import pytest

from cpu_dist.common.config import DataConfig
from cpu_dist.common.flags import parse_args
from cpu_dist.common.setting_flags import setting_flag
from cpu_dist.common.validate import ConfigError, validate
from cpu_dist.data.convert import convert

pytestmark = pytest.mark.timeout(30)

SAMPLE = str(Path(__file__).parent / "data" / "criteo_sample.tsv")


def data(argv: list[str]) -> DataConfig:
    return validate(parse_args(argv), 3).data


def test_criteo_bin_wants_a_finished_conversion(tmp_path):
    with pytest.raises(ConfigError, match="--data criteo-bin needs --data-path DIR"):
        data(["--data", "criteo-bin"])
    with pytest.raises(ConfigError, match=r"no manifest\.json"):
        data(["--data", "criteo-bin", "--data-path", str(tmp_path)])
    convert([SAMPLE], tmp_path / "o", progress=False, log=lambda *_: None)
    d = data(["--data", "criteo-bin", "--data-path", str(tmp_path / "o")])
    assert (d.kind, d.epochs, d.shuffle, d.max_ind_range) == ("criteo-bin", 1, False, None)
    with pytest.raises(ConfigError, match="give it to the converter"):
        data(["--data", "criteo-bin", "--data-path", str(tmp_path / "o"), "--skip-bad-lines"])


def test_hashing_epochs_and_shuffle():
    sizes = ",".join(str(10 + f) for f in range(26))
    d = data(
        [
            *("--data", "criteo", "--data-path", SAMPLE),
            *("--num-embeddings-per-feature", sizes, "--max-ind-range", "1000"),
            *("--epochs", "3", "--shuffle"),
        ]
    )
    assert d.num_embeddings_per_feature == tuple(range(10, 36)) and d.max_ind_range == 1000
    assert d.epochs == 3 and d.shuffle


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--num-embeddings-per-feature", "1,2,3"], "3 sizes given, Criteo has 26"),
        (["--num-embeddings-per-feature", "a" + ",1" * 25], "26 integers"),
        (["--num-embeddings-per-feature", "0" + ",1" * 25], r"in \[1, 2\*\*32\]"),
        (["--max-ind-range", "0"], "--max-ind-range 0"),
        (["--max-ind-range", str(2**32 + 1)], "--max-ind-range"),
        (["--epochs", "0"], "--epochs 0"),
    ],
)
def test_bad_values_name_the_flag(extra, message):
    with pytest.raises(ConfigError, match=message):
        data(["--data", "criteo", "--data-path", SAMPLE, *extra])


def test_file_flags_are_refused_with_the_synthetic_stream():
    with pytest.raises(ConfigError, match="--epochs, --shuffle: only for --data criteo"):
        data(["--epochs", "2", "--shuffle"])
    with pytest.raises(ConfigError, match="--max-ind-range"):
        data(["--max-ind-range", "10"])
    assert data([]).epochs == DataConfig.epochs


def test_settings_name_their_flags():
    assert setting_flag("data.num_embeddings_per_feature") == "--num-embeddings-per-feature"
    assert setting_flag("data.max_ind_range") == "--max-ind-range"
