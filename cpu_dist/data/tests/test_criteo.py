"""The Criteo TSV reader on 200 real rows and on malformed files."""

import gzip
import math
from pathlib import Path

import numpy as np
import pytest

from cpu_dist.data import CriteoFormatError, CriteoTSV
from cpu_dist.data.criteo import NUM_FIELDS

pytestmark = pytest.mark.timeout(30)

SAMPLE = Path(__file__).parent / "data" / "criteo_sample.tsv"
LINES = SAMPLE.read_text().splitlines()


def _fields(i: int) -> list[str]:
    return LINES[i].split("\t")


def _all(reader: CriteoTSV, split: str, batch_size: int):
    batches = list(reader.iter_batches(batch_size, split))
    return (
        batches,
        np.concatenate([b.labels for b in batches]),
        np.concatenate([b.keys for b in batches]),
    )


def test_sample_counts_and_labels():
    r = CriteoTSV(SAMPLE, eval_every=0)
    batches, labels, _ = _all(r, "train", 50)
    assert len(batches) == 4 and all(len(b) == 50 for b in batches)
    assert labels.sum() == 49 and labels.size == 200
    np.testing.assert_array_equal(labels, [float(_fields(i)[0]) for i in range(200)])
    assert r.bad_lines == 0


def test_last_partial_batch_is_dropped():
    batches = list(CriteoTSV(SAMPLE, eval_every=0).iter_batches(64))
    assert [len(b) for b in batches] == [64, 64, 64]


def test_every_tenth_line_is_eval():
    r = CriteoTSV(SAMPLE, eval_every=10)
    _, train_labels, _ = _all(r, "train", 20)
    _, eval_labels, eval_keys = _all(r, "eval", 20)
    assert train_labels.size == 180 and eval_labels.size == 20
    eval_lines = [i for i in range(200) if i % 10 == 9]  # 1-based lines 10, 20, ...
    np.testing.assert_array_equal(eval_labels, [float(_fields(i)[0]) for i in eval_lines])
    assert eval_keys[0, 0] == int(_fields(9)[14], 16)
    assert train_labels.sum() + eval_labels.sum() == 49


def test_hex_parsing_negative_ints_and_empty_fields():
    b = next(CriteoTSV(SAMPLE, eval_every=0).iter_batches(3))
    f0, f1 = _fields(0), _fields(1)
    # Row 0: C1=05db9164, C2=08d6d899; C20 empty -> id 0 of feature 19.
    assert b.keys[0, 0] == 0x05DB9164
    assert b.keys[0, 1] == (1 << 32) | 0x08D6D899
    assert f0[1 + 13 + 19] == "" and b.keys[0, 19] == 19 << 32
    assert np.all(b.keys[:, 25] >> 32 == 25)
    # Row 0: I1 empty -> 0, I2 = 3 -> log(4), I3 = 260 -> log(261).
    assert f0[1] == "" and b.dense[0, 0] == 0.0
    assert b.dense[0, 1] == pytest.approx(math.log(4.0))
    assert b.dense[0, 2] == pytest.approx(math.log(261.0))
    # Row 1: I2 = -1 -> clamped to 0 -> log(1) = 0.
    assert f1[2] == "-1" and b.dense[1, 1] == 0.0
    assert b.dense.dtype == np.float32 and b.keys.dtype == np.int64


def test_hash_size_folds_values():
    b = next(CriteoTSV(SAMPLE, hash_size=1000, eval_every=0).iter_batches(1))
    assert b.keys[0, 0] == 0x05DB9164 % 1000
    assert b.keys[0, 1] == (1 << 32) | (0x08D6D899 % 1000)


def _write(tmp_path: Path, lines: list[str], name: str = "bad.tsv") -> Path:
    p = tmp_path / name
    p.write_text("".join(line + "\n" for line in lines))
    return p


def _replace(line: str, col: int, value: str) -> str:
    f = line.split("\t")
    f[col] = value
    return "\t".join(f)


@pytest.mark.parametrize(
    "bad,problem",
    [
        ("\t".join(LINES[0].split("\t")[:-1]), "expected 40"),
        (_replace(LINES[0], 0, "2"), "label must be 0 or 1"),
        (_replace(LINES[0], 3, "12.5"), "I3"),
        (_replace(LINES[0], 3, "+5"), "I3"),
        (_replace(LINES[0], 14, "0x12"), "C1"),
        (_replace(LINES[0], 15, "zz12"), "C2"),
        ("", "expected 40"),
    ],
)
def test_malformed_line_names_file_line_and_problem(tmp_path, bad, problem):
    path = _write(tmp_path, [LINES[0], LINES[1], bad, LINES[2]])
    with pytest.raises(CriteoFormatError) as e:
        list(CriteoTSV(path, eval_every=0).iter_batches(2))
    msg = str(e.value)
    assert f"{path}:3:" in msg and problem in msg
    assert isinstance(e.value, ValueError)


def test_skip_bad_lines_counts_them(tmp_path):
    bad = _replace(LINES[0], 0, "x")
    path = _write(tmp_path, [LINES[0], bad, LINES[1], bad, LINES[2], LINES[3]])
    r = CriteoTSV(path, skip_bad_lines=True, eval_every=0)
    batches = list(r.iter_batches(2))
    assert r.bad_lines == 2
    assert len(batches) == 2
    np.testing.assert_array_equal(batches[1].labels, [float(_fields(2)[0]), float(_fields(3)[0])])


def test_gzip_and_crlf(tmp_path):
    p = tmp_path / "s.tsv.gz"
    with gzip.open(p, "wt") as fh:
        fh.write("".join(line + "\r\n" for line in LINES[:4]))
    b = next(CriteoTSV(p, eval_every=0).iter_batches(4))
    assert b.keys[0, 0] == 0x05DB9164 and b.keys[0, 25] >> 32 == 25


def test_constructor_checks(tmp_path):
    with pytest.raises(FileNotFoundError):
        CriteoTSV(tmp_path / "missing.tsv")
    with pytest.raises(ValueError):
        CriteoTSV(SAMPLE, eval_every=1)
    with pytest.raises(ValueError):
        CriteoTSV(SAMPLE, hash_size=2**33)
    assert len(LINES[0].split("\t")) == NUM_FIELDS
