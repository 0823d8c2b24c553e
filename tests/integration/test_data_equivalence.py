"""Real Criteo data paths through whole jobs: training from the converted directory equals
training from the TSV file bit for bit, W=1 equals W=2, and both equal the single-process
reference on the same batches (real mpirun jobs, real PS ranks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpu_dist.data import make_dataset
from cpu_dist.data.convert import convert
from cpu_dist.data.generate import write_days, write_file
from cpu_dist.train.metrics import read_summary

from .launch import assert_dumps_close, assert_dumps_equal, small_reference, train

pytestmark = pytest.mark.timeout(600)

QUIET = {"progress": False, "log": lambda *_: None, "block_bytes": 1 << 16}
HASHING = ["--max-ind-range", "50000"]


def reference(dataset, steps: int, batch_size: int = 96) -> dict:
    return small_reference(dataset, steps, batch_size)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A generated file with two malformed lines, and its conversion (both skip them)."""
    tmp = tmp_path_factory.mktemp("data")
    src = write_file(tmp / "train.txt", 3000)
    lines = src.read_bytes().split(b"\n")
    lines[100] = lines[100].replace(b"\t", b"\t\t", 1)
    lines[2050] = b"2" + lines[2050][1:]
    src.write_bytes(b"\n".join(lines))
    convert([str(src)], tmp / "bin", skip_bad_lines=True, **QUIET)
    return tmp, src, tmp / "bin"


def test_converted_equals_tsv_bit_for_bit_and_the_reference(data):
    tmp, src, out = data
    flags = [*HASHING, "--shuffle"]
    tsv = train(
        tmp, "tsv", 2, 1, ["--data", "criteo", "--data-path", str(src), "--skip-bad-lines", *flags]
    )
    binary = train(tmp, "bin", 2, 1, ["--data", "criteo-bin", "--data-path", str(out), *flags])
    assert len(binary["table/embedding/keys"]) > 1000
    keys = binary["table/embedding/keys"]
    assert (keys & 0xFFFFFFFF).max() < 50000  # --max-ind-range folded them
    assert_dumps_equal(tsv, binary, "TSV vs converted")
    ds = make_dataset("criteo-bin", path=out, max_ind_range=50000, shuffle=True)
    assert_dumps_close(binary, reference(ds, 20), 1e-5, "converted vs the reference")


def test_one_worker_equals_two(data):
    tmp, _, out = data
    flags = ["--data", "criteo-bin", "--data-path", str(out), *HASHING]
    one = train(tmp, "w1", 1, 1, flags)
    two = train(tmp, "w2", 2, 2, flags)
    assert_dumps_close(two, one, 1e-5, "W=2 P=2 vs W=1 P=1")


def test_training_stops_after_the_epochs(tmp_path):
    """The 200-row sample: 180 train lines make 11 batches of 16; two epochs are 22 steps."""
    sample = Path(__file__).resolve().parents[2] / "cpu_dist/data/tests/data/criteo_sample.tsv"
    convert([str(sample)], tmp_path / "bin", **QUIET)
    metrics = tmp_path / "m.jsonl"
    flags = ["--batch-size", "16", "--max_step", "1000", "--epochs", "2", "--shuffle"]
    flags += ["--data", "criteo-bin", "--data-path", str(tmp_path / "bin")]
    got = train(tmp_path, "epochs", 2, 1, [*flags, "--metrics-out", str(metrics)])
    assert read_summary(metrics)["steps"] == 22
    ds = make_dataset("criteo-bin", path=tmp_path / "bin", epochs=2, shuffle=True)
    assert_dumps_close(got, reference(ds, 1000, batch_size=16), 1e-5, "two epochs")


def test_day_files_train_on_all_days_but_the_last(tmp_path):
    days = write_days(tmp_path / "days", 3, 800, gz=True)
    convert([str(d) for d in days], tmp_path / "bin", **QUIET)
    got = train(
        tmp_path, "days", 2, 1, ["--data", "criteo-bin", "--data-path", str(tmp_path / "bin")]
    )
    ds = make_dataset("criteo-bin", path=tmp_path / "bin")
    assert ds.num_steps(96) == 16  # 1600 rows of day_0 and day_1
    # --max_step 20 alone trains 20 steps, into the second pass over the training days
    endless = make_dataset("criteo-bin", path=tmp_path / "bin", epochs=None)
    assert_dumps_close(got, reference(endless, 20), 1e-5, "day files")
