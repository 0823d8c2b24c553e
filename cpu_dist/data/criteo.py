"""Streaming reader of the real Criteo display-advertising TSV format.

Format, one sample per line, tab-separated, no header: a 0/1 label, 13 integer count fields,
26 categorical fields written as hex strings (8 digits in the real logs). Any field but the
label may be empty (missing); integer fields can be negative.

Transforms (DLRM conventions, so results compare with published DLRM numbers):

- Dense: missing -> 0, negative -> 0, then ``log(1 + x)``; float32.
- Categorical: ``int(hex, 16) % hash_size`` fused with the feature index as
  ``(f << 32) | id`` (:func:`cpu_dist.data.keys.fuse_criteo`). A missing field is id 0 of that
  feature; with the default ``hash_size = 2**32`` it therefore shares its key with the (rare)
  literal value ``00000000``, which DLRM's preprocessing also does.

Splits: with ``eval_every = k`` the 0-based line numbers ``n`` with ``n % k == k - 1`` (every
k-th line) form the eval split and all others the train split; ``eval_every = 0`` puts every
line in train. Only the lines of the requested split are parsed, so a malformed line of the
other split goes unnoticed (and uncounted) until that split is read.

Batches are global batches in file order; a last partial batch is dropped, so every step has
the full global batch that the workers split evenly. Files ending in ``.gz`` are read through
gzip.
"""

from __future__ import annotations

import gzip
import io
import os
import re
from collections.abc import Iterator

import numpy as np

from cpu_dist.data.batch import Batch
from cpu_dist.data.keys import (
    CRITEO_DEFAULT_HASH_SIZE,
    CRITEO_FEATURE_SHIFT,
    check_criteo_hash_size,
)

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE

_INT_RE = re.compile(r"-?[0-9]+\Z")
_HEX_RE = re.compile(r"[0-9a-fA-F]+\Z")


class CriteoFormatError(ValueError):
    """A malformed line; the message names the file, the 1-based line number and the problem."""


class CriteoTSV:
    """Reads global batches of a Criteo TSV file, streaming (see module docstring)."""

    kind = "criteo"
    num_dense = NUM_DENSE
    num_sparse = NUM_SPARSE

    def __init__(
        self,
        path: str | os.PathLike,
        hash_size: int = CRITEO_DEFAULT_HASH_SIZE,
        skip_bad_lines: bool = False,
        eval_every: int = 10,
    ) -> None:
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"Criteo file not found: {self.path}")
        self.hash_size = check_criteo_hash_size(hash_size)
        if eval_every < 0 or eval_every == 1:
            raise ValueError(f"eval_every must be 0 (no eval split) or >= 2, got {eval_every}")
        self.eval_every = int(eval_every)
        self.skip_bad_lines = bool(skip_bad_lines)
        self.bad_lines = 0
        self._feature_bits = np.arange(NUM_SPARSE, dtype=np.int64) << np.int64(CRITEO_FEATURE_SHIFT)

    def _open(self) -> io.TextIOBase:
        if self.path.endswith(".gz"):
            return gzip.open(self.path, "rt", encoding="utf-8", errors="replace", newline="\n")
        return open(self.path, encoding="utf-8", errors="replace", newline="\n")

    def _in_split(self, line_index: int, split: str) -> bool:
        is_eval = self.eval_every > 0 and line_index % self.eval_every == self.eval_every - 1
        return is_eval if split == "eval" else not is_eval

    def parse_line(self, line: str, line_number: int) -> tuple[float, list[float], list[int]]:
        """One line -> (label, 13 raw dense values (missing = 0), 26 hashed ids).

        Raises CriteoFormatError naming the file and the 1-based ``line_number``.
        """
        fields = line.rstrip("\r\n").split("\t")
        if len(fields) != NUM_FIELDS:
            self._fail(
                line_number, f"expected {NUM_FIELDS} tab-separated fields, found {len(fields)}"
            )
        label = fields[0]
        if label not in ("0", "1"):
            self._fail(line_number, f"label must be 0 or 1, found {label!r}")
        dense: list[float] = []
        for j, s in enumerate(fields[1 : 1 + NUM_DENSE]):
            if not s:
                dense.append(0.0)
            elif _INT_RE.match(s):
                dense.append(float(int(s)))
            else:
                self._fail(
                    line_number, f"integer field I{j + 1} (column {j + 2}) is not an integer: {s!r}"
                )
        ids: list[int] = []
        for f, s in enumerate(fields[1 + NUM_DENSE :]):
            if not s:
                ids.append(0)
            elif _HEX_RE.match(s):
                ids.append(int(s, 16) % self.hash_size)
            else:
                self._fail(
                    line_number, f"categorical field C{f + 1} (column {f + 15}) is not hex: {s!r}"
                )
        return float(label), dense, ids

    def _fail(self, line_number: int, problem: str) -> None:
        raise CriteoFormatError(f"{self.path}:{line_number}: {problem}")

    def _make_batch(
        self, labels: list[float], dense: list[list[float]], ids: list[list[int]]
    ) -> Batch:
        d = dense_transform(np.asarray(dense, dtype=np.float64))
        keys = np.asarray(ids, dtype=np.int64) | self._feature_bits[None, :]
        return Batch(dense=d, keys=keys, labels=np.asarray(labels, dtype=np.float32))

    def iter_batches(self, batch_size: int, split: str = "train") -> Iterator[Batch]:
        """Global batches of ``split`` in file order; the last partial batch is dropped."""
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        labels: list[float] = []
        dense: list[list[float]] = []
        ids: list[list[int]] = []
        with self._open() as fh:
            for index, line in enumerate(fh):
                if not self._in_split(index, split):
                    continue
                try:
                    y, x, k = self.parse_line(line, index + 1)
                except CriteoFormatError:
                    if not self.skip_bad_lines:
                        raise
                    self.bad_lines += 1
                    continue
                labels.append(y)
                dense.append(x)
                ids.append(k)
                if len(labels) == batch_size:
                    yield self._make_batch(labels, dense, ids)
                    labels, dense, ids = [], [], []

    def train_batches(self, batch_size: int, start_step: int = 0) -> Iterator[tuple[int, Batch]]:
        """``(step, batch)`` of one pass over the train split, skipping the first start_step."""
        for step, batch in enumerate(self.iter_batches(batch_size, "train")):
            if step >= start_step:
                yield step, batch

    def eval_batches(self, batch_size: int, num_batches: int) -> Iterator[Batch]:
        """The first ``num_batches`` batches of the eval split (fewer if the file is short)."""
        if num_batches <= 0:
            return
        for i, batch in enumerate(self.iter_batches(batch_size, "eval")):
            yield batch
            if i + 1 >= num_batches:
                return


def dense_transform(raw: np.ndarray) -> np.ndarray:
    """The dense transform alone (missing already 0): clamp negatives, ``log1p``; float32."""
    return np.log1p(np.maximum(np.asarray(raw, dtype=np.float64), 0.0)).astype(np.float32)
