"""Training from a converted Criteo directory (``--data criteo-bin --data-path DIR``).

The arrays of ``layout.py`` are memory-mapped, read only; nothing is parsed.  A worker reads its
share of a batch straight from the maps (one slice per array for the day-file splits; the rows
of one or two chunks for the every-k-th-line split), and keys are fused from the raw values and
the hashing flags as the batch is made (``keys.fuse_criteo_columns``), so the same conversion
serves any table size and gives the keys the TSV reader gives.

Splits follow the inputs the directory was converted from:

- one input: the every-k-th-line rule of the TSV reader, by the physical line numbers stored
  with the rows (``eval_every``), no test split;
- several inputs (the Terabyte days, ordered by day): train on every input but the last; the
  last one's first half of rows (``rows // 2``) is the validation split (``eval_batches``), its
  second half the test split (``test_batches``), as in DLRM's Terabyte setup.

Opening checks the manifest's format and version and every array file's size; checksums are
checked by ``python -m cpu_dist.data.convert --verify DIR`` (reading every byte), not here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cpu_dist.data.file_dataset import FileDataset
from cpu_dist.data.layout import ARRAYS, LayoutError, read_manifest
from cpu_dist.data.multi_hot import MultiHot
from cpu_dist.data.splits import EveryKth, RowRange, Split
from cpu_dist.data.tsv_parse import Rows


class CriteoBinary(FileDataset):
    """Batches of a converted Criteo directory (see the module docstring)."""

    kind = "criteo-bin"

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        hash_sizes: Sequence[int] | None = None,
        eval_every: int = 10,
        epochs: int | None = 1,
        shuffle: bool = False,
        seed: int = 0,
        multi_hot: MultiHot | None = None,
    ) -> None:
        super().__init__(
            hash_sizes=hash_sizes,
            epochs=epochs,
            shuffle=shuffle,
            seed=seed,
            multi_hot=multi_hot,
        )
        if eval_every < 0 or eval_every == 1:
            raise ValueError(f"eval_every must be 0 (no eval split) or >= 2, got {eval_every}")
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        self.eval_every = int(eval_every)
        self.inputs = [p["name"] for p in self.manifest["inputs"]]
        self._maps: list[dict[str, np.ndarray]] = []
        counts = []
        for part in self.manifest["inputs"]:
            rows = int(part["rows"])
            maps = {}
            for a in ARRAYS:
                p = self.directory / part["name"] / a.file
                want = a.nbytes(rows)
                size = p.stat().st_size if p.is_file() else None
                if size != want:
                    found = "missing" if size is None else f"{size} bytes"
                    raise LayoutError(f"{p}: {found}, the manifest's {rows} rows need {want}")
                maps[a.name] = (
                    np.memmap(p, dtype=a.dtype, mode="r", shape=a.shape(rows))
                    if rows
                    else np.zeros(a.shape(0), dtype=a.dtype)
                )
            self._maps.append(maps)
            counts.append(rows)
        self._starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        self.num_rows = int(self._starts[-1])
        self.bad_lines = int(self.manifest.get("bad_lines", 0))
        self._splits: dict[str, Split | None]
        if len(counts) == 1:
            if self.eval_every:
                lines = self._maps[0]["lines"]
                k = self.eval_every

                def lines_of(lo: int, hi: int) -> np.ndarray:
                    return np.asarray(lines[lo:hi], dtype=np.int64)

                self._splits = {
                    "train": EveryKth(lines_of, counts[0], k, held_out=False),
                    "eval": EveryKth(lines_of, counts[0], k, held_out=True),
                    "test": None,
                }
            else:
                self._splits = {"train": RowRange(0, counts[0]), "eval": None, "test": None}
        else:
            last_lo, last_hi = int(self._starts[-2]), int(self._starts[-1])
            mid = last_lo + counts[-1] // 2
            self._splits = {
                "train": RowRange(0, last_lo),
                "eval": RowRange(last_lo, mid),
                "test": RowRange(mid, last_hi),
            }

    def split(self, name: str) -> Split | None:
        return self._splits[name]

    def read_rows(self, rows: np.ndarray) -> Rows:
        if len(rows) == 0:
            return Rows.empty()
        parts = []
        first = int(np.searchsorted(self._starts, rows[0], side="right")) - 1
        last = int(np.searchsorted(self._starts, rows[-1], side="right")) - 1
        for i in range(first, last + 1):
            lo, hi = np.searchsorted(rows, self._starts[i : i + 2])
            local = rows[lo:hi] - self._starts[i]
            if not len(local):
                continue
            a, b = int(local[0]), int(local[-1]) + 1
            index: slice | np.ndarray = slice(a, b) if b - a == len(local) else local
            m = self._maps[i]
            parts.append(
                Rows(
                    np.array(m["labels"][index]),
                    np.array(m["dense"][index]),
                    np.array(m["cats"][index]),
                    np.array(m["lines"][index]),
                )
            )
        return Rows.concat(parts)
