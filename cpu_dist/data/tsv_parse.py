"""Parsing blocks of Criteo TSV lines with pyarrow's CSV reader: the one parser of both the TSV
reader (``criteo.py``) and the converter (``convert.py``), so the two agree value for value.

Format, one sample per line, tab-separated, no header: a 0/1 label, 13 integer count fields,
26 categorical fields written as hex strings (8 digits in the real logs). Any field but the
label may be empty (missing); integer fields can be negative.  What a line must be, exactly:

- 40 fields; the label is ``0`` or ``1``;
- an integer field is empty or ``-?[0-9]+`` within int64;
- a categorical field is empty or ``[0-9a-fA-F]+`` whose value fits 32 bits (leading zeros
  allowed); a wider value is an error, because the converted layout stores 32-bit values;
- lines end with ``\\n`` (a ``\\r`` before it is dropped; a ``\\r`` anywhere else is an error).

Transforms (DLRM conventions, so results compare with published DLRM numbers): dense missing
-> 0, negative -> 0, then ``log(1 + x)`` in float64, stored as float32
(:func:`dense_transform`); categorical missing -> 0, else the integer the hex string encodes
(raw: the hashing into table sizes happens when batches are read, ``keys.py``).

Why pyarrow (the converter's docstring has the figures): its CSV reader parses a block from a
byte buffer into typed columns without a Python loop, rejects a line with the wrong field count
(polars fills missing fields with nulls), and reading the hex columns as
``fixed_size_binary[8]`` lets numpy decode them eight characters at a time (``_decode_hex8``).

How a block is parsed (:func:`parse_block`): the fast path parses the whole block and checks
it with vectorised tests that accept exactly the lines above (a byte-set test first: pyarrow's
integer parser alone would accept ``" 5"`` or ``"0x10"``).  A block that fails any test is cut
in halves, recursively, down to the single lines that fail: a line is malformed if and only if
the fast path refuses it alone, so every way of cutting a file into blocks finds the same bad
lines.  A bad line is an error naming the file and the 1-based line (:class:`CriteoFormatError`,
with what is wrong from :func:`diagnose_line`), or, with ``skip_bad_lines``, is dropped and
counted.  Each kept row carries its 0-based physical line number, so splits by line number
agree however many lines were skipped before.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.csv as pcsv  # type: ignore[import-untyped]

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE

_NAMES = (
    ["label"] + [f"I{j + 1}" for j in range(NUM_DENSE)] + [f"C{f + 1}" for f in range(NUM_SPARSE)]
)
_FIRST_CAT = 1 + NUM_DENSE
# Every byte a well-formed block may hold.  Anything else (space, 'x', '+', '.', non-ASCII)
# marks the block for the line-by-line path.
_ALLOWED = b"0123456789abcdefABCDEF-\t\r\n"


def _convert_options(cat_type: pa.DataType) -> pcsv.ConvertOptions:
    types = {"label": pa.binary(1)}
    types.update({n: pa.int64() for n in _NAMES[1:_FIRST_CAT]})
    types.update(dict.fromkeys(_NAMES[_FIRST_CAT:], cat_type))
    return pcsv.ConvertOptions(
        column_types=types, null_values=[""], strings_can_be_null=True, check_utf8=False
    )


_READ = pcsv.ReadOptions(column_names=_NAMES, use_threads=False, block_size=1 << 26)
_PARSE = pcsv.ParseOptions(delimiter="\t", quote_char=False, ignore_empty_lines=False)
_CONVERT_FIXED = _convert_options(pa.binary(8))  # the common case: 8 hex digits or empty
_CONVERT_GENERAL = _convert_options(pa.binary())  # any other length
_COLUMN_RE = re.compile(r"column #(\d+)")


class CriteoFormatError(ValueError):
    """A malformed line; the message names the file, the 1-based line number and the problem."""


@dataclass(frozen=True)
class Rows:
    """Parsed samples: ``labels`` uint8 [n], ``dense`` float32 [n, 13] (transformed),
    ``cats`` uint32 [n, 26] (raw values), ``lines`` int64 [n] (0-based physical line)."""

    labels: np.ndarray
    dense: np.ndarray
    cats: np.ndarray
    lines: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def take(self, index: np.ndarray | slice) -> Rows:
        return Rows(self.labels[index], self.dense[index], self.cats[index], self.lines[index])

    @staticmethod
    def empty() -> Rows:
        return Rows(
            np.zeros(0, np.uint8),
            np.zeros((0, NUM_DENSE), np.float32),
            np.zeros((0, NUM_SPARSE), np.uint32),
            np.zeros(0, np.int64),
        )

    @staticmethod
    def concat(parts: list[Rows]) -> Rows:
        if not parts:
            return Rows.empty()
        if len(parts) == 1:
            return parts[0]
        return Rows(
            np.concatenate([p.labels for p in parts]),
            np.concatenate([p.dense for p in parts]),
            np.concatenate([p.cats for p in parts]),
            np.concatenate([p.lines for p in parts]),
        )


def dense_transform(raw: np.ndarray) -> np.ndarray:
    """The dense transform alone (missing already 0): clamp negatives, ``log1p``; float32."""
    return np.log1p(np.maximum(np.asarray(raw, dtype=np.float64), 0.0)).astype(np.float32)


class _Reject(Exception):
    """The fast path refuses a block; ``detail`` is pyarrow's reason, if it gave one."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail)
        self.detail = detail


# --- hex decoding, eight ASCII characters in one uint64 (first character in the low byte) ----

_U = np.uint64
_LOW_NIBBLES = _U(0x0F0F0F0F0F0F0F0F)
_ONES = _U(0x0101010101010101)
_HIGH_BITS = _U(0x8080808080808080)
_ASCII_ZEROS = _U(0x3030303030303030)  # "00000000"
_PASS_ROWS = 512  # rows per numpy pass: 26 x 512 words = 104 KiB


def _decode_hex8(w: np.ndarray) -> np.ndarray:
    """uint64 words of 8 hex digits -> their uint32 values (valid digits assumed)."""
    x = (w & _LOW_NIBBLES) + _U(9) * ((w >> _U(6)) & _ONES)  # '0'-'9' -> 0-9, 'a'/'A' -> 10
    x = ((x << _U(4)) | (x >> _U(8))) & _U(0x00FF00FF00FF00FF)  # digit pairs -> bytes
    x = ((x << _U(8)) | (x >> _U(16))) & _U(0x0000FFFF0000FFFF)  # byte pairs -> 16 bits
    return (((x << _U(16)) | (x >> _U(32))) & _U(0xFFFFFFFF)).astype(np.uint32)


def _all_hex8(w: np.ndarray) -> bool:
    """Whether every byte of every word is 0-9, a-f or A-F.  Lane-wise compares by adding a
    constant to every byte and reading its top bit: once no byte has its top bit set (checked
    first), no add below overflows into the next byte."""
    if np.any(w & _HIGH_BITS):
        return False
    ge_0 = w + _U(0x5050505050505050)  # byte >= '0' (0x30) sets its top bit
    ge_colon = w + _U(0x4646464646464646)  # byte >= ':' (0x3A)
    low = w | _U(0x2020202020202020)  # fold 'A'-'F' onto 'a'-'f'
    ge_a = low + _U(0x1F1F1F1F1F1F1F1F)  # byte >= 'a' (0x61)
    ge_g = low + _U(0x1919191919191919)  # byte >= 'g' (0x67)
    ok = ((ge_0 & ~ge_colon) | (ge_a & ~ge_g)) & _HIGH_BITS
    return bool(np.all(ok == _HIGH_BITS))


def _validity(arr: pa.Array, n: int) -> np.ndarray | None:
    """Boolean [n] of non-null slots, or None when nothing is null."""
    if arr.null_count == 0:
        return None
    bitmap = np.frombuffer(arr.buffers()[0], np.uint8)
    bits = np.unpackbits(bitmap, bitorder="little", count=arr.offset + n)
    return bits[arr.offset :].view(bool)


def _general_words(arr: pa.Array, n: int) -> np.ndarray:
    """Hex strings of any length, right-aligned into 8-byte words of zeros; a value needing
    more than 8 digits (more than 32 bits) is refused."""
    offsets = np.frombuffer(arr.buffers()[1], np.int32, count=n + 1, offset=arr.offset * 4)
    data = np.frombuffer(arr.buffers()[2], np.uint8) if arr.buffers()[2] else np.zeros(0, np.uint8)
    starts, ends = offsets[:-1].astype(np.int64), offsets[1:].astype(np.int64)
    lengths = ends - starts
    valid = _validity(arr, n)
    if valid is not None:
        lengths = np.where(valid, lengths, 0)
    # Digits before the last eight must be zeros.
    long = lengths > 8
    if np.any(long):
        idx = np.flatnonzero(long)
        heads = [data[starts[i] : ends[i] - 8] for i in idx]
        if any(np.any(h != ord("0")) for h in heads):
            raise _Reject()
    take = np.minimum(lengths, 8)
    padded = np.full((n, 8), ord("0"), dtype=np.uint8)
    rows = np.repeat(np.arange(n), take)
    within = np.arange(int(take.sum())) - np.repeat(np.cumsum(take) - take, take)
    cols = 8 - take[rows] + within
    src = ends[rows] - take[rows] + within
    padded[rows, cols] = data[src]
    return padded.view(np.uint64).reshape(n)


def _fast(segment: bytes, num_lines: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parse ``num_lines`` complete lines, or raise _Reject if any of them is malformed."""
    if segment.translate(None, _ALLOWED):
        raise _Reject()
    buf = pa.py_buffer(segment)
    try:
        table = pcsv.read_csv(
            buf, read_options=_READ, parse_options=_PARSE, convert_options=_CONVERT_FIXED
        )
        fixed = True
    except pa.ArrowInvalid as e:
        m = _COLUMN_RE.search(str(e))
        if not (m and int(m.group(1)) >= _FIRST_CAT and "fixed_size_binary" in str(e)):
            raise _Reject(str(e)) from None
        try:  # a categorical value of another length than 8
            table = pcsv.read_csv(
                buf, read_options=_READ, parse_options=_PARSE, convert_options=_CONVERT_GENERAL
            )
        except pa.ArrowInvalid as e2:
            raise _Reject(str(e2)) from None
        fixed = False
    n = table.num_rows
    if n != num_lines:  # a lone '\r' splits a line in two
        raise _Reject()
    cols = [c.combine_chunks() if c.num_chunks != 1 else c.chunk(0) for c in table.columns]
    label = cols[0]
    if label.null_count:
        raise _Reject()
    labels = np.frombuffer(label.buffers()[1], np.uint8, count=n, offset=label.offset) - 48
    if np.any(labels > 1):
        raise _Reject()
    # One array per kind of column (C++ concatenation) viewed as [F, n], then the numpy work in
    # passes of _PASS_ROWS rows: a few calls per pass instead of one per column keeps the GIL
    # free for other threads, and temporaries under glibc's mmap threshold (128 KiB) come from
    # the heap instead of fresh pages (page faults cost more than the arithmetic here).
    ints = pa.concat_arrays(cols[1:_FIRST_CAT])
    raw = np.frombuffer(ints.buffers()[1], np.int64, count=NUM_DENSE * n, offset=ints.offset * 8)
    raw = raw.reshape(NUM_DENSE, n)
    raw_ok = _validity(ints, NUM_DENSE * n)
    if fixed:
        hexes = pa.concat_arrays(cols[_FIRST_CAT:])
        words = np.frombuffer(
            hexes.buffers()[1], np.uint64, count=NUM_SPARSE * n, offset=hexes.offset * 8
        )
        words_ok = _validity(hexes, NUM_SPARSE * n)
    else:
        words = np.concatenate([_general_words(c, n) for c in cols[_FIRST_CAT:]])
        words_ok = None
    words = words.reshape(NUM_SPARSE, n)
    dense = np.empty((n, NUM_DENSE), np.float32)
    cats = np.empty((n, NUM_SPARSE), np.uint32)
    for lo in range(0, n, _PASS_ROWS):
        hi = min(lo + _PASS_ROWS, n)
        x = raw[:, lo:hi]
        if raw_ok is not None:
            x = np.where(raw_ok.reshape(NUM_DENSE, n)[:, lo:hi], x, 0)
        dense[lo:hi] = dense_transform(x).T
        w = words[:, lo:hi]
        w = (
            np.where(words_ok.reshape(NUM_SPARSE, n)[:, lo:hi], w, _ASCII_ZEROS)
            if words_ok is not None
            else np.ascontiguousarray(w)
        )
        if not _all_hex8(w):
            raise _Reject()
        cats[lo:hi] = _decode_hex8(w).T
    return labels, dense, cats


def _newlines(data: bytes) -> np.ndarray:
    return np.flatnonzero(np.frombuffer(data, np.uint8) == 10)


def count_lines(data: bytes) -> int:
    """Lines in ``data``: its newlines, plus one for a last line without a newline."""
    n = data.count(b"\n")
    return n + 1 if data and not data.endswith(b"\n") else n


def parse_block(
    data: bytes,
    first_line: int,
    path: str,
    skip_bad_lines: bool = False,
    num_lines: int | None = None,
) -> tuple[Rows, int]:
    """Complete lines (``data`` ends at a newline or at the end of the file) whose first is
    0-based line ``first_line`` of ``path`` -> (their rows, the number of bad lines skipped).
    ``num_lines``: their number, when the caller knows it (:func:`count_lines` otherwise).

    Without ``skip_bad_lines`` the first bad line raises :class:`CriteoFormatError`."""
    n = count_lines(data) if num_lines is None else num_lines
    if n == 0:
        return Rows.empty(), 0
    try:
        labels, dense, cats = _fast(data, n)
        return Rows(labels, dense, cats, np.arange(first_line, first_line + n)), 0
    except _Reject:
        pass
    nl = _newlines(data)
    starts = np.concatenate([[0], nl + 1])[:n]
    ends = np.concatenate([nl + 1, [len(data)]])[:n]
    parts: list[Rows] = []
    bad = 0

    def split(lo: int, hi: int) -> None:  # lines [lo, hi) of the block, known to hold a bad one
        nonlocal bad
        if hi - lo == 1:
            line = data[starts[lo] : ends[lo]]
            try:
                labels, dense, cats = _fast(line, 1)
            except _Reject as e:
                if not skip_bad_lines:
                    raise CriteoFormatError(
                        f"{path}:{first_line + lo + 1}: {diagnose_line(line, e.detail)}"
                    ) from None
                bad += 1
                return
            parts.append(Rows(labels, dense, cats, np.array([first_line + lo], np.int64)))
            return
        mid = (lo + hi) // 2
        for a, b in ((lo, mid), (mid, hi)):
            try:
                labels, dense, cats = _fast(data[starts[a] : ends[b - 1]], b - a)
            except _Reject:
                split(a, b)
                continue
            parts.append(Rows(labels, dense, cats, np.arange(first_line + a, first_line + b)))

    split(0, n)
    return Rows.concat(parts), bad


_INT_RE = re.compile(rb"-?[0-9]+\Z")
_HEX_RE = re.compile(rb"[0-9a-fA-F]+\Z")


def diagnose_line(line: bytes, detail: str = "") -> str:
    """What is wrong with one line the fast path refused, in words."""

    def show(b: bytes) -> str:
        return repr(b.decode("utf-8", errors="replace"))

    body = line.rstrip(b"\r\n") if line.endswith(b"\n") else line
    if b"\r" in body.rstrip(b"\r"):
        return "carriage return inside the line"
    fields = body.rstrip(b"\r").split(b"\t")
    if len(fields) != NUM_FIELDS:
        return f"expected {NUM_FIELDS} tab-separated fields, found {len(fields)}"
    if fields[0] not in (b"0", b"1"):
        return f"label must be 0 or 1, found {show(fields[0])}"
    for j, s in enumerate(fields[1:_FIRST_CAT]):
        if s and not _INT_RE.match(s):
            return f"integer field I{j + 1} (column {j + 2}) is not an integer: {show(s)}"
        if s and not -(2**63) <= int(s) < 2**63:
            return f"integer field I{j + 1} (column {j + 2}) does not fit 64 bits: {show(s)}"
    for f, s in enumerate(fields[_FIRST_CAT:]):
        if s and not _HEX_RE.match(s):
            return f"categorical field C{f + 1} (column {f + 15}) is not hex: {show(s)}"
        if s and int(s, 16) >= 2**32:
            return f"categorical field C{f + 1} (column {f + 15}) is wider than 32 bits: {show(s)}"
    return f"cannot be parsed ({detail or 'unknown reason'})"


def iter_blocks(
    fh: BinaryIO, block_bytes: int, first_line: int = 0
) -> Iterator[tuple[bytes, int, int]]:
    """``(complete lines, 0-based number of the first, how many)`` of a binary stream, about
    ``block_bytes`` at a time (a block holds at least one whole line)."""
    rest = b""
    line = first_line
    while True:
        chunk = fh.read(block_bytes)
        if not chunk:
            if rest:
                yield rest, line, 1
            return
        data = rest + chunk if rest else chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # no newline yet: one line longer than a block
            rest = data
            continue
        block, rest = data[:cut], data[cut:]
        n = block.count(b"\n")
        yield block, line, n
        line += n
