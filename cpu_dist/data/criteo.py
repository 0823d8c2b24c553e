"""The Criteo TSV reader (``--data criteo --data-path FILE``): for quick use on a file as it is.

For data that is read more than once, convert it (``python -m cpu_dist.data.convert``) and
train with ``--data criteo-bin``: the same batches, without parsing.  The format, what makes a
line malformed and the transforms are those of :mod:`cpu_dist.data.tsv_parse`, the parser both
paths share.

A first pass over the file (when the dataset is made) counts its lines and keeps the byte
offset of every 64th line, in memory: then any range of lines is read with one seek, and a
worker parses only its own share of each batch (:meth:`FileDataset.worker_batch`).  With
``skip_bad_lines`` that pass also parses every line, to know which rows exist before any batch
is formed (so batches are the converter's, line for line); without it, every line is a row and a
malformed one is an error when a batch that covers it is read.  Lines of either split are
checked, whichever split a batch comes from, as the converter does.

Splits: with ``eval_every = k`` the 0-based physical line numbers ``n`` with
``n % k == k - 1`` (every k-th line) form the eval split and all others the train split;
``eval_every = 0`` puts every line in train.  One file has no test split.

Files ending in ``.gz`` are read through gzip: the first pass decompresses the whole file, and a
read that goes backwards (``--shuffle``, a resumed run) decompresses again from the start, so
convert such a file for anything but one pass.
"""

from __future__ import annotations

import gzip
import os
import threading
from collections.abc import Sequence
from typing import BinaryIO

import numpy as np

from cpu_dist.data.file_dataset import FileDataset
from cpu_dist.data.keys import CRITEO_DEFAULT_HASH_SIZE, criteo_hash_sizes
from cpu_dist.data.multi_hot import MultiHot
from cpu_dist.data.splits import EveryKth, RowRange, Split
from cpu_dist.data.tsv_parse import (
    NUM_DENSE,
    NUM_FIELDS,
    NUM_SPARSE,
    CriteoFormatError,
    Rows,
    dense_transform,
    iter_blocks,
    parse_block,
)

__all__ = [
    "NUM_DENSE",
    "NUM_FIELDS",
    "NUM_SPARSE",
    "CriteoFormatError",
    "CriteoTSV",
    "dense_transform",
]

INDEX_STRIDE = 64  # a byte offset is kept for every 64th line
_BLOCK_BYTES = 2 << 20


class CriteoTSV(FileDataset):
    """Batches of one Criteo TSV file, plain or ``.gz`` (see the module docstring)."""

    kind = "criteo"

    def __init__(
        self,
        path: str | os.PathLike,
        hash_size: int = CRITEO_DEFAULT_HASH_SIZE,
        skip_bad_lines: bool = False,
        eval_every: int = 10,
        *,
        hash_sizes: Sequence[int] | None = None,
        epochs: int | None = 1,
        shuffle: bool = False,
        seed: int = 0,
        multi_hot: MultiHot | None = None,
    ) -> None:
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"Criteo file not found: {self.path}")
        if eval_every < 0 or eval_every == 1:
            raise ValueError(f"eval_every must be 0 (no eval split) or >= 2, got {eval_every}")
        if hash_sizes is None:
            hash_sizes = criteo_hash_sizes(hash_size=hash_size)
        super().__init__(
            hash_sizes=hash_sizes,
            epochs=epochs,
            shuffle=shuffle,
            seed=seed,
            multi_hot=multi_hot,
        )
        self.hash_size = int(hash_size)
        self.eval_every = int(eval_every)
        self.skip_bad_lines = bool(skip_bad_lines)
        self._gz = self.path.endswith(".gz")
        # Parsing is the whole cost of a share: two loader threads make two at once.  A gzip
        # stream is read forwards only (a read behind the last decompresses from the start),
        # so it gets one thread, which reads the shares in order.
        self.loader_threads = 1 if self._gz else 2
        self._lock = threading.Lock()  # one reader of the gzip stream at a time
        self._gz_fh: gzip.GzipFile | None = None
        self._build_index()
        rows = self.num_rows = self.num_lines - len(self._bad)
        self._splits: dict[str, Split | None]
        if self.eval_every:
            k = self.eval_every
            self._splits = {
                "train": EveryKth(self._lines_of, rows, k, held_out=False),
                "eval": EveryKth(self._lines_of, rows, k, held_out=True),
                "test": None,
            }
        else:
            self._splits = {"train": RowRange(0, rows), "eval": None, "test": None}

    # --- the first pass -------------------------------------------------------------------------

    def _open(self) -> BinaryIO:
        if self._gz:
            return gzip.open(self.path, "rb")  # type: ignore[return-value]
        return open(self.path, "rb")

    def _build_index(self) -> None:
        offsets: list[np.ndarray] = []
        bad: list[np.ndarray] = []
        line = byte = 0
        with self._open() as fh:
            for block, first, _ in iter_blocks(fh, _BLOCK_BYTES):
                starts = np.concatenate(
                    [[0], np.flatnonzero(np.frombuffer(block, np.uint8) == 10) + 1]
                )
                if starts[-1] == len(block):
                    starts = starts[:-1]
                numbers = first + np.arange(len(starts))
                offsets.append(byte + starts[numbers % INDEX_STRIDE == 0])
                if self.skip_bad_lines:
                    rows, skipped = parse_block(block, first, self.path, skip_bad_lines=True)
                    if skipped:
                        bad.append(np.setdiff1d(numbers, rows.lines))
                line, byte = first + len(starts), byte + len(block)
        self.num_lines, self.num_bytes = line, byte
        self._offsets = np.concatenate([np.zeros(0, np.int64), *offsets]).astype(np.int64)
        self._bad = np.concatenate([np.zeros(0, np.int64), *bad]).astype(np.int64)
        # Row r is line r + (number of bad lines before it): searchsorted over bad[i] - i.
        self._bad_shift = self._bad - np.arange(len(self._bad), dtype=np.int64)
        self.bad_lines = len(self._bad)

    def _lines_of(self, lo: int, hi: int) -> np.ndarray:
        rows = np.arange(lo, hi, dtype=np.int64)
        if len(self._bad):
            rows += np.searchsorted(self._bad_shift, rows, side="right")
        return rows

    # --- reading --------------------------------------------------------------------------------

    def split(self, name: str) -> Split | None:
        return self._splits[name]

    def _read_bytes(self, start: int, stop: int) -> bytes:
        if not self._gz:
            with open(self.path, "rb") as fh:
                return os.pread(fh.fileno(), stop - start, start)
        with self._lock:
            if self._gz_fh is None or self._gz_fh.tell() > start:
                if self._gz_fh is not None:
                    self._gz_fh.close()
                self._gz_fh = gzip.open(self.path, "rb")
            assert self._gz_fh is not None
            self._gz_fh.seek(start)
            return self._gz_fh.read(stop - start)

    def read_lines(self, first: int, stop: int) -> bytes:
        """The bytes of 0-based lines ``[first, stop)``."""
        g0, g1 = first // INDEX_STRIDE, -(-stop // INDEX_STRIDE)
        b0 = int(self._offsets[g0])
        b1 = int(self._offsets[g1]) if g1 < len(self._offsets) else self.num_bytes
        buf = self._read_bytes(b0, b1)
        newlines = np.flatnonzero(np.frombuffer(buf, np.uint8) == 10)
        r0, r1 = first - g0 * INDEX_STRIDE, stop - g0 * INDEX_STRIDE
        s = 0 if r0 == 0 else int(newlines[r0 - 1]) + 1
        e = int(newlines[r1 - 1]) + 1 if r1 - 1 < len(newlines) else len(buf)
        return buf[s:e]

    def read_rows(self, rows: np.ndarray) -> Rows:
        if len(rows) == 0:
            return Rows.empty()
        lines = self._lines_of(int(rows[0]), int(rows[-1]) + 1)[rows - rows[0]]
        first = int(lines[0])
        stop = int(lines[-1]) + 1
        parsed, _ = parse_block(
            self.read_lines(first, stop), first, self.path, self.skip_bad_lines, stop - first
        )
        at = np.searchsorted(parsed.lines, lines)
        if np.any(at >= len(parsed)) or np.any(
            parsed.lines[np.minimum(at, len(parsed) - 1)] != lines
        ):
            raise CriteoFormatError(f"{self.path}: changed while it was read (lines moved)")
        return parsed.take(at)

    def __del__(self) -> None:
        fh = getattr(self, "_gz_fh", None)
        if fh is not None:
            fh.close()
