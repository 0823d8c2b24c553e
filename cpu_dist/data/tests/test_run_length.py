"""How long a job trains: file data trains its epochs unless --max_step says otherwise, the
synthetic stream --max_step, and no data for one step is an error naming the sizes."""

from __future__ import annotations

import pytest

from cpu_dist.common.config import DataConfig, TrainConfig
from cpu_dist.data import make_dataset
from cpu_dist.data.generate import write_file
from cpu_dist.data.run_length import RunLengthError, run_length


@pytest.fixture(scope="module")
def tsv(tmp_path_factory):
    # 1000 lines: every 10th held out, 900 training rows, 9 steps of 96 per epoch
    return str(write_file(tmp_path_factory.mktemp("rl") / "train.txt", 1000))


def length(tsv: str, batch: int = 96, max_step: int | None = None, epochs: int | None = None):
    data_epochs = epochs if epochs is not None else (None if max_step is not None else 1)
    data = DataConfig(kind="criteo", path=tsv, epochs=data_epochs)
    train = TrainConfig(
        batch_size=batch,
        max_step=max_step if max_step is not None else TrainConfig.max_step,
        max_step_given=max_step is not None,
    )
    dataset = make_dataset("criteo", path=tsv, epochs=data_epochs)
    return run_length(train, data, dataset)


def test_file_data_trains_one_epoch_by_default_and_says_so(tsv):
    got = length(tsv)
    assert got.steps == 9
    assert "--epochs 1 x 9 steps per epoch (900 training rows" in got.describe()


def test_a_resumed_run_says_what_remains(tsv):
    got = length(tsv, epochs=3).describe(start=4)
    assert got.startswith("resuming at step 4: training 23 more steps (to step 27): --epochs 3")


def test_epochs_bound_the_run_without_max_step(tsv):
    assert length(tsv, epochs=3).steps == 27


def test_max_step_alone_decides_across_epochs(tsv):
    got = length(tsv, max_step=20)
    assert got.steps == 20 and "2.22 epochs" in got.why


def test_with_both_the_first_end_wins(tsv):
    assert length(tsv, max_step=5, epochs=2).steps == 5
    beyond = length(tsv, max_step=50, epochs=2)
    assert beyond.steps == 18 and "--max_step 50 is beyond them" in beyond.why


def test_a_batch_larger_than_the_training_split_is_an_error_naming_the_sizes(tsv):
    with pytest.raises(RunLengthError, match=r"--batch-size 960 is larger than .*\(900 rows"):
        length(tsv, batch=960)


def test_the_synthetic_stream_trains_max_step():
    data, train = DataConfig(), TrainConfig()
    got = run_length(train, data, make_dataset("synthetic"))
    assert got.steps == TrainConfig.max_step and "the default --max_step" in got.why
