"""The shared TSV block parser: values, the malformed-line rules, and that bad lines are found
the same however a file is cut into blocks."""

from pathlib import Path

import numpy as np
import pytest

from cpu_dist.data.tsv_parse import (
    CriteoFormatError,
    _decode_hex8,
    count_lines,
    dense_transform,
    iter_blocks,
    parse_block,
)

pytestmark = pytest.mark.timeout(60)

SAMPLE = Path(__file__).parent / "data" / "criteo_sample.tsv"
DATA = SAMPLE.read_bytes()
LINES = DATA.split(b"\n")[:-1]


def _python_parse(line: bytes) -> tuple[int, list[int], list[int]]:
    """The format by hand, one line: (label, 13 raw ints with missing 0, 26 values)."""
    f = line.rstrip(b"\r").split(b"\t")
    return (
        int(f[0]),
        [int(x) if x else 0 for x in f[1:14]],
        [int(x, 16) if x else 0 for x in f[14:]],
    )


def _with(line: bytes, column: int, value: bytes) -> bytes:
    f = line.split(b"\t")
    f[column] = value
    return b"\t".join(f)


def test_sample_values_equal_a_plain_python_parse():
    rows, bad = parse_block(DATA, 0, "s")
    assert bad == 0 and len(rows) == 200
    for i, line in enumerate(LINES):
        label, ints, values = _python_parse(line)
        assert rows.labels[i] == label
        np.testing.assert_array_equal(rows.cats[i], values)
        np.testing.assert_array_equal(rows.dense[i], dense_transform(np.array([ints]))[0])
    np.testing.assert_array_equal(rows.lines, np.arange(200))
    assert rows.cats.dtype == np.uint32 and rows.dense.dtype == np.float32


def test_hex_decoding_of_every_digit_and_case():
    rng = np.random.default_rng(0)
    values = np.concatenate([[0, 0xFFFFFFFF, 0x0123ABCD], rng.integers(0, 2**32, 5000)])
    for fmt in ("{:08x}", "{:08X}"):
        text = b"".join(fmt.format(int(v)).encode() for v in values)
        words = np.frombuffer(text, np.uint64)
        np.testing.assert_array_equal(_decode_hex8(words), values.astype(np.uint32))


def test_other_lengths_leading_zeros_and_crlf():
    line = _with(_with(_with(LINES[0], 15, b"abc"), 16, b"00000000000000ffffffff"), 17, b"7")
    rows, _ = parse_block(line + b"\r\n" + LINES[1] + b"\r\n", 0, "s")
    assert rows.cats[0, 1:4].tolist() == [0xABC, 0xFFFFFFFF, 7]
    np.testing.assert_array_equal(rows.cats[1], _python_parse(LINES[1])[2])


@pytest.mark.parametrize(
    "bad,problem",
    [
        (_with(LINES[0], 14, b"1ffffffff"), "C1 (column 15) is wider than 32 bits"),
        (_with(LINES[0], 20, b"abc def0"), "C7 (column 21) is not hex"),
        (_with(LINES[0], 2, b" 5"), "I2 (column 3) is not an integer"),
        (_with(LINES[0], 2, b"0x10"), "I2 (column 3) is not an integer"),
        (_with(LINES[0], 2, b"99999999999999999999"), "I2 (column 3) does not fit 64 bits"),
        (_with(LINES[0], 0, b"01"), "label must be 0 or 1"),
        (_with(LINES[0], 0, b""), "label must be 0 or 1"),
        (LINES[0] + b"\t", "expected 40"),
        (LINES[0].replace(b"\t", b"\r", 1), "carriage return"),
        (b"", "expected 40"),
        (_with(LINES[0], 30, "é".encode()), "C17 (column 31) is not hex"),
    ],
)
def test_a_bad_line_is_an_error_naming_file_line_and_problem(bad, problem):
    data = b"\n".join([LINES[0], LINES[1], bad, LINES[2]]) + b"\n"
    with pytest.raises(CriteoFormatError) as e:
        parse_block(data, 100, "f.tsv")
    assert "f.tsv:103: " in str(e.value) and problem in str(e.value)
    rows, skipped = parse_block(data, 100, "f.tsv", skip_bad_lines=True)
    assert skipped == 1 and rows.lines.tolist() == [100, 101, 103]


def test_bad_lines_are_the_same_whatever_the_blocks():
    rng = np.random.default_rng(1)
    lines = list(LINES)
    bad_at = sorted(rng.choice(len(lines), 17, replace=False).tolist())
    for i in bad_at:
        lines[i] = _with(lines[i], int(rng.integers(0, 40)), b"zz")
    data = b"\n".join(lines) + b"\n"
    whole, skipped = parse_block(data, 0, "f", skip_bad_lines=True)
    assert skipped == len(bad_at)
    assert sorted(set(range(200)) - set(whole.lines.tolist())) == bad_at
    for block_bytes in (1, 700, 5000):
        import io

        parts = [
            parse_block(b, first, "f", skip_bad_lines=True)
            for b, first, _ in iter_blocks(io.BytesIO(data), block_bytes)
        ]
        assert sum(p[1] for p in parts) == len(bad_at)
        np.testing.assert_array_equal(np.concatenate([p[0].lines for p in parts]), whole.lines)
        np.testing.assert_array_equal(np.concatenate([p[0].cats for p in parts]), whole.cats)


def test_first_bad_line_is_reported_first():
    lines = list(LINES[:50])
    lines[7] = _with(lines[7], 0, b"2")
    lines[30] = _with(lines[30], 0, b"3")
    with pytest.raises(CriteoFormatError, match=r"f:8: label must be 0 or 1, found '2'"):
        parse_block(b"\n".join(lines) + b"\n", 0, "f")


def test_line_counting_and_blocks():
    import io

    assert count_lines(b"") == 0 and count_lines(b"a\n") == 1 and count_lines(b"a\nb") == 2
    blocks = list(iter_blocks(io.BytesIO(b"a\nbb\nccc"), 3))
    assert blocks == [(b"a\n", 0, 1), (b"bb\n", 1, 1), (b"ccc", 2, 1)]
