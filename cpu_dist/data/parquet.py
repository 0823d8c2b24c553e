"""Training from Parquet files (``--data parquet``), in the layout NVTabular and Merlin write.

One column per feature: a categorical feature reads the column of its own name, an integer
column (one id a sample) or a ``list<integer>`` one (a bag a sample); ids are any 64-bit
value, negative ones taken as unsigned (a table with ``num_embeddings`` folds them as
unsigned, ``keys.fold_ids``).  The label is an integer, boolean or float column of 0/1; dense
columns are used as they are (no log transform: a Criteo file converted by
``python -m cpu_dist.data.to_parquet`` holds the transformed values); a weighted feature's
weights are a ``list<float>`` column as long as its ids, sample by sample.

Splits, as the Criteo readers cut them (:mod:`cpu_dist.data.splits`): a directory's files
(``*.parquet``, ``*.parq``) sorted by name, training on every file but the last, whose first
half of rows is the validation split and second half the test split; a single file: every
10th row (``row % 10 == 9``) validation, no test split.  Batches, epochs and shuffling are
:class:`~cpu_dist.data.file_dataset.FileDataset`'s, so a worker reads its share alone.

A batch is read from slices of :data:`SLICE_ROWS` rows of a row group (memory-mapped, each
decoded once, in order along its group, and kept while they fit :data:`CACHE_BYTES`): a
worker's share of consecutive steps falls in the same slices, and its first batch waits for
one slice, not for a whole row group (65536 rows of MLPerf's 214 ids: about 30 ms instead of
0.6 s; read slice by slice the group also decodes in half the time).  Files
are checked when opened (every file's schema: a missing column or a wrong type is an error
naming the file and the column) and each slice when decoded (a null, a label that is not
0/1, or a weights list whose length differs from its ids': the file, the column and the row).
Every id travels in the batch's bags (``Batch.bags``, lengths 1 for an integer column), so the
64 bits reach the tables unmasked.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from cpu_dist.common.parquet_schema import (
    ParquetColumns,
    ParquetError,
    check_file,
    check_schema,
    check_weight_lengths,
    parquet_files,
    read_schema,
    resolve_columns,
)
from cpu_dist.data.batch import Bags, Batch
from cpu_dist.data.file_dataset import FileDataset
from cpu_dist.data.splits import EveryKth, RowRange, Split

__all__ = [
    "CACHE_BYTES",
    "SLICE_ROWS",
    "ParquetColumns",
    "ParquetData",
    "ParquetError",
    "check_schema",
    "parquet_files",
    "read_schema",
    "resolve_columns",
]

# Decoded slices kept per dataset (bytes of numpy arrays); the least recent goes first.
CACHE_BYTES = 512 << 20
# Rows of a row group decoded at a time (the last slice of a group may be shorter).
SLICE_ROWS = 4096


@dataclass
class _Ragged:
    """One column of one row group: ``values`` and (for a list column) ``offsets``."""

    values: np.ndarray
    offsets: np.ndarray | None  # int64 [n + 1]; None: one value a row

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + (0 if self.offsets is None else self.offsets.nbytes)

    def take(self, local: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray | None]:
        """``(values, lengths)`` of these rows (lengths None: one value a row)."""
        if self.offsets is None:
            return self.values[local], None
        if isinstance(local, slice):
            a, b = local.start, local.stop
            lo, hi = int(self.offsets[a]), int(self.offsets[b])
            return self.values[lo:hi], np.diff(self.offsets[a : b + 1])
        starts = self.offsets[local]
        lengths = self.offsets[local + 1] - starts
        total = int(lengths.sum())
        if not total:
            return self.values[:0], lengths
        ends = np.cumsum(lengths)
        index = np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)
        return self.values[index], lengths


class _Slice:
    """A decoded slice of a row group: label, dense and each column the job reads."""

    def __init__(self, label: np.ndarray, dense: np.ndarray, columns: dict[str, _Ragged]):
        self.label, self.dense, self.columns = label, dense, columns
        self.nbytes = label.nbytes + dense.nbytes + sum(c.nbytes for c in columns.values())


@dataclass
class _Reading:
    """A row group being decoded slice by slice: its batches' iterator, the next slice of the
    group it yields (``next``), and rows it has yielded beyond the last slice (``rest``)."""

    batches: Iterator[pa.RecordBatch]
    next: int = 0
    rest: pa.RecordBatch | None = None


def _ids(file: Path, name: str, column: pa.ChunkedArray, first_row: int) -> _Ragged:
    """An integer or list<integer> column as int64 values (uint64 bits kept)."""
    arr = column.combine_chunks()
    if arr.null_count:
        row = first_row + int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise ParquetError(f"{file}: column {name!r}: row {row}: null (every sample needs ids)")
    offsets = None
    if isinstance(arr, (pa.ListArray, pa.LargeListArray)):
        raw = arr.offsets.to_numpy().astype(np.int64)
        inner = arr.values.slice(int(raw[0]), int(raw[-1] - raw[0]))
        offsets = raw - raw[0]
        if inner.null_count:
            at = int(np.flatnonzero(inner.is_null().to_numpy(zero_copy_only=False))[0])
            row = first_row + int(np.searchsorted(offsets, at, side="right")) - 1
            raise ParquetError(f"{file}: column {name!r}: row {row}: a null id in the list")
        arr = inner
    v = arr.to_numpy(zero_copy_only=False)
    values = v.view(np.int64) if v.dtype == np.uint64 else v.astype(np.int64, copy=False)
    return _Ragged(np.ascontiguousarray(values), offsets)


def _floats(file: Path, name: str, column: pa.ChunkedArray, first_row: int) -> np.ndarray:
    arr = column.combine_chunks()
    if arr.null_count:
        row = first_row + int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise ParquetError(f"{file}: column {name!r}: row {row}: null")
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.float32)


class ParquetData(FileDataset):
    """Batches of Parquet files (see the module docstring).

    Args:
        path: a file, or a directory of files.
        columns: the columns the job reads (:func:`resolve_columns`).
        eval_every: the one-file split's k (0: no eval split).
        epochs, shuffle, seed: as :class:`~cpu_dist.data.file_dataset.FileDataset`'s.

    Example::

        cols = resolve_columns(read_schema("day.parquet"))
        data = ParquetData("day.parquet", cols)
        step, batch = next(data.train_batches(4096))
        batch.bags["cat_0"].values  # int64 ids, 64-bit
    """

    kind = "parquet"
    keeps_decoded = True  # (the loader's warm_first_share reads the first share early)

    def __init__(
        self,
        path: str | os.PathLike,
        columns: ParquetColumns,
        *,
        eval_every: int = 10,
        epochs: int | None = 1,
        shuffle: bool = False,
        seed: int = 0,
        cache_bytes: int = CACHE_BYTES,
        slice_rows: int = SLICE_ROWS,
    ) -> None:
        super().__init__(hash_sizes=None, epochs=epochs, shuffle=shuffle, seed=seed)
        if eval_every < 0 or eval_every == 1:
            raise ValueError(f"eval_every must be 0 (no eval split) or >= 2, got {eval_every}")
        if slice_rows < 1:
            raise ValueError(f"slice_rows must be >= 1, got {slice_rows}")
        self.columns, self._slice_rows = columns, int(slice_rows)
        self.num_dense = len(columns.dense)
        self.num_sparse = len(columns.features)
        self.sparse_names = columns.features
        self.files = parquet_files(path)
        self._readers: list[pq.ParquetFile] = []
        # per file: the first row of each slice and n; each slice's (row group, slice in it)
        self._slices: list[np.ndarray] = []
        self._slice_of: list[list[tuple[int, int]]] = []
        counts = []
        for f in self.files:
            try:
                reader = pq.ParquetFile(f, memory_map=True)
            except (OSError, pa.ArrowException) as exc:
                raise ParquetError(f"{f}: not a readable Parquet file: {exc}") from None
            check_file(f, columns, reader)
            meta = reader.metadata
            sizes, where = [], []
            for g in range(meta.num_row_groups):
                n = meta.row_group(g).num_rows
                step = self._slice_rows
                sizes += [min(step, n - a) for a in range(0, n, step)]
                where += [(g, c) for c in range(-(-n // step))]
            self._slices.append(np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]))
            self._slice_of.append(where)
            self._readers.append(reader)
            counts.append(int(meta.num_rows))
        self._starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        self.num_rows = int(self._starts[-1])
        self._read = [columns.label, *columns.dense, *columns.features, *columns.weights.values()]
        self._cache: OrderedDict[tuple[int, int], _Slice] = OrderedDict()  # (file, slice)
        self._cache_bytes, self._held = int(cache_bytes), 0
        self._reading: dict[tuple[int, int], _Reading] = {}  # (file, row group)
        self._lock = threading.Lock()
        self._splits: dict[str, Split | None]
        if len(counts) == 1:
            n = counts[0]
            if eval_every:

                def lines_of(lo: int, hi: int) -> np.ndarray:
                    return np.arange(lo, hi, dtype=np.int64)

                self._splits = {
                    "train": EveryKth(lines_of, n, eval_every, held_out=False),
                    "eval": EveryKth(lines_of, n, eval_every, held_out=True),
                    "test": None,
                }
            else:
                self._splits = {"train": RowRange(0, n), "eval": None, "test": None}
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

    # --- row groups, slice by slice --------------------------------------------------------

    def _slice(self, i: int, k: int) -> _Slice:
        """File ``i``'s slice ``k``, decoded and checked (kept while it fits the cache)."""
        with self._lock:
            hit = self._cache.get((i, k))
            if hit is None:
                self._decode_upto(i, k)
                hit = self._cache[(i, k)]
            self._cache.move_to_end((i, k))
            return hit

    def _keep(self, i: int, k: int, piece: _Slice) -> None:
        self._cache[(i, k)] = piece
        self._held += piece.nbytes
        while self._held > self._cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._held -= old.nbytes

    def _decode_upto(self, i: int, k: int) -> None:
        """Decode the slices of slice ``k``'s row group up to ``k``, keeping each: a group's
        slices come in order (an earlier one gone from the cache starts the group again)."""
        g, c = self._slice_of[i][k]
        file, bounds = self.files[i], self._slices[i]
        reading = self._reading.get((i, g))
        if reading is None or reading.next > c:
            reading = _Reading(
                # on the loader's thread alone: pyarrow's pool would take the trainer's cores
                # (and its start doubles the first slice's wait: 56 -> 31 ms for 4096 rows)
                self._readers[i].iter_batches(
                    batch_size=self._slice_rows,
                    row_groups=[g],
                    columns=self._read,
                    use_threads=False,
                )
            )
            self._reading[(i, g)] = reading
        try:
            while reading.next <= c:
                at = k - c + reading.next
                lo, hi = int(bounds[at]), int(bounds[at + 1])
                table = self._next_rows(file, g, reading, lo, hi - lo, self._culprit(i, g))
                if (i, at) not in self._cache:
                    self._keep(i, at, self._convert(file, table, lo))
        except BaseException:
            del self._reading[(i, g)]  # a failed read leaves no half-read group behind
            raise
        if reading.next * self._slice_rows >= self._readers[i].metadata.row_group(g).num_rows:
            del self._reading[(i, g)]  # the group's last slice

    def _culprit(self, i: int, g: int) -> Callable[[], str | None]:
        """Which column of file ``i``'s row group ``g`` cannot be decoded: each the job reads,
        decoded alone (called only once the group failed, so that the error names it)."""

        def find() -> str | None:
            for column in self._read:
                try:
                    self._readers[i].read_row_group(g, columns=[column], use_threads=False)
                except (OSError, pa.ArrowException):
                    return column
            return None

        return find

    @staticmethod
    def _next_rows(
        file: Path,
        g: int,
        reading: _Reading,
        first: int,
        n: int,
        culprit: Callable[[], str | None] = lambda: None,
    ) -> pa.Table:
        """The next ``n`` rows of the group ``reading`` reads (``first``: the first's row in
        the file), whatever sizes the batches pyarrow yields; a group that cannot be decoded
        (a corrupt page) is a ParquetError naming the column ``culprit`` finds."""
        parts = [] if reading.rest is None else [reading.rest]
        have = sum(b.num_rows for b in parts)
        try:
            while have < n:
                batch = next(reading.batches)
                parts.append(batch)
                have += batch.num_rows
        except StopIteration:
            raise ParquetError(
                f"{file}: row group {g} ends at row {first + have}, before row {first + n} "
                "(its metadata's count)"
            ) from None
        except (OSError, pa.ArrowException) as exc:
            column = culprit()
            where = f"column {column!r}: " if column is not None else ""
            raise ParquetError(
                f"{file}: {where}row group {g} (rows {first}...): cannot be decoded: {exc}"
            ) from None
        last, extra = parts[-1], have - n
        parts[-1] = last.slice(0, last.num_rows - extra)
        reading.rest = last.slice(last.num_rows - extra) if extra else None
        reading.next += 1
        return pa.Table.from_batches(parts)

    def _convert(self, file: Path, table: pa.Table, first: int) -> _Slice:
        """A slice's columns as numpy arrays, checked (``first``: its first row in the file)."""
        cols = self.columns
        label = _floats(file, cols.label, table.column(cols.label), first)
        bad = np.flatnonzero((label != 0) & (label != 1))
        if bad.size:
            raise ParquetError(
                f"{file}: column {cols.label!r}: row {first + int(bad[0])}: label "
                f"{label[bad[0]]:g}, expected 0 or 1"
            )
        n = table.num_rows
        dense = np.empty((n, len(cols.dense)), dtype=np.float32)
        for j, c in enumerate(cols.dense):
            dense[:, j] = _floats(file, c, table.column(c), first)
        columns = {f: _ids(file, f, table.column(f), first) for f in cols.features}
        for f, c in cols.weights.items():
            w = _ids_weights(file, c, table.column(c), first)
            ids = columns[f]
            id_len = np.diff(ids.offsets) if ids.offsets is not None else np.ones(n, np.int64)
            assert w.offsets is not None  # a list column's
            w_len = np.diff(w.offsets)
            check_weight_lengths(file, f, c, id_len, w_len, first)
            columns[c] = w
        return _Slice(label, dense, columns)

    # --- batches ------------------------------------------------------------------------------

    def _batch(self, split: Split, a: int, b: int) -> Batch:
        rows = split.positions(a, b)
        parts: list[tuple[_Slice, np.ndarray | slice]] = []
        if len(rows):
            first = int(np.searchsorted(self._starts, rows[0], side="right")) - 1
            last = int(np.searchsorted(self._starts, rows[-1], side="right")) - 1
            for i in range(first, last + 1):
                lo, hi = np.searchsorted(rows, self._starts[i : i + 2])
                local = rows[lo:hi] - self._starts[i]
                bounds = self._slices[i]
                g0 = int(np.searchsorted(bounds, local[0], side="right")) - 1 if len(local) else 0
                while len(local):
                    end = int(bounds[g0 + 1])
                    cut = int(np.searchsorted(local, end))
                    mine, local = local[:cut] - bounds[g0], local[cut:]
                    if len(mine):
                        a0, b0 = int(mine[0]), int(mine[-1]) + 1
                        index = slice(a0, b0) if b0 - a0 == len(mine) else mine
                        parts.append((self._slice(i, g0), index))
                    g0 += 1
        return self._assemble(parts, len(rows))

    def _assemble(self, parts: list[tuple[_Slice, np.ndarray | slice]], n: int) -> Batch:
        cols = self.columns
        labels = np.concatenate([g.label[x] for g, x in parts]) if parts else np.zeros(0)
        dense = (
            np.concatenate([g.dense[x] for g, x in parts])
            if parts
            else np.zeros((0, len(cols.dense)), np.float32)
        )
        weight_of = dict(cols.weights)
        bags = {}
        for f in cols.features:
            values, lengths = _join([g.columns[f].take(x) for g, x in parts], n)
            weights = None
            if f in weight_of:
                weights, _ = _join([g.columns[weight_of[f]].take(x) for g, x in parts], n)
                weights = weights.astype(np.float32, copy=False)
            bags[f] = Bags(lengths=lengths, values=values, weights=weights)
        return Batch(
            dense=np.ascontiguousarray(dense, dtype=np.float32),
            keys=np.zeros((n, len(cols.features)), dtype=np.int64),
            labels=labels.astype(np.float32, copy=False),
            bags=bags,
        )


def _ids_weights(file: Path, name: str, column: pa.ChunkedArray, first_row: int) -> _Ragged:
    """A list<float> weights column as float32 values and offsets."""
    arr = column.combine_chunks()
    if arr.null_count:
        row = first_row + int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise ParquetError(f"{file}: column {name!r}: row {row}: null weights")
    raw = arr.offsets.to_numpy().astype(np.int64)
    inner = arr.values.slice(int(raw[0]), int(raw[-1] - raw[0]))
    offsets = raw - raw[0]
    if inner.null_count:
        at = int(np.flatnonzero(inner.is_null().to_numpy(zero_copy_only=False))[0])
        row = first_row + int(np.searchsorted(offsets, at, side="right")) - 1
        raise ParquetError(f"{file}: column {name!r}: row {row}: a null weight")
    values = np.asarray(inner.to_numpy(zero_copy_only=False), dtype=np.float32)
    return _Ragged(values, offsets)


def _join(
    taken: list[tuple[np.ndarray, np.ndarray | None]], n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Parts' ``(values, lengths)`` as one: lengths 1 where a part has one value a row."""
    if not taken:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    values = np.concatenate([v for v, _ in taken]) if len(taken) > 1 else taken[0][0]
    lengths = np.concatenate(
        [np.ones(len(v), np.int64) if ln is None else ln.astype(np.int64) for v, ln in taken]
    )
    if values.dtype != np.float32:
        values = np.ascontiguousarray(values, dtype=np.int64)
    assert lengths.shape[0] == n
    return values, lengths
