"""What the two Criteo file readers share: splits, batch order, keys.

A subclass (``CriteoTSV``, ``CriteoBinary``) says which rows form each split and how to read
given rows (:meth:`FileDataset.read_rows`); this class turns positions into batches the same
way for both, so the TSV file and its conversion give the same batches bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from cpu_dist.data.batch import Batch
from cpu_dist.data.keys import CRITEO_DEFAULT_HASH_SIZE, CRITEO_VALUE_MASK, fuse_criteo_columns
from cpu_dist.data.multi_hot import MultiHot
from cpu_dist.data.splits import BatchOrder, RowRange, Split
from cpu_dist.data.tsv_parse import NUM_DENSE, NUM_SPARSE, Rows


class FileDataset:
    """Global batches, worker shares, eval and test batches of a Criteo file.

    ``epochs`` passes over the train split (default 1; None: endless, the caller stops after
    its step count), in file order or, with ``shuffle``, in a block order drawn from
    ``(seed, epoch)`` (:class:`~cpu_dist.data.splits.BatchOrder`).
    Eval and test batches are always the first batches of their split, in file order.
    ``multi_hot`` (:class:`~cpu_dist.data.multi_hot.MultiHot`) makes every batch's features
    of size > 1 multi-hot, from their one-hot ids."""

    kind = "criteo"
    num_dense = NUM_DENSE
    num_sparse = NUM_SPARSE
    num_rows: int  # every reader counts its rows when it opens

    def __init__(
        self,
        *,
        hash_sizes: Sequence[int] | None,
        epochs: int | None,
        shuffle: bool,
        seed: int,
        multi_hot: MultiHot | None = None,
    ) -> None:
        sizes = tuple(hash_sizes) if hash_sizes is not None else (CRITEO_DEFAULT_HASH_SIZE,) * 26
        if len(sizes) != NUM_SPARSE:
            raise ValueError(f"{len(sizes)} hash sizes for {NUM_SPARSE} sparse features")
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        self.hash_sizes = sizes
        self.epochs = None if epochs is None else int(epochs)
        self.shuffle, self.seed = bool(shuffle), int(seed)
        self.multi_hot = multi_hot
        self._orders: dict[int, BatchOrder] = {}

    # --- what a subclass provides -------------------------------------------------------------

    def split(self, name: str) -> Split | None:
        """The ``train``, ``eval`` or ``test`` split (None where the data has none)."""
        raise NotImplementedError

    def read_rows(self, rows: np.ndarray) -> Rows:
        """Rows with these (increasing) indices, in that order."""
        raise NotImplementedError

    # --- batches ------------------------------------------------------------------------------

    def _order(self, batch_size: int) -> BatchOrder:
        order = self._orders.get(batch_size)
        if order is None:
            train = self.split("train")
            n = len(train) if train is not None else 0
            order = BatchOrder(n, batch_size, self.epochs, self.shuffle, self.seed)
            self._orders[batch_size] = order
        return order

    def num_steps(self, batch_size: int) -> int | None:
        """Training steps of all epochs at this global batch size (None: endless)."""
        return self._order(batch_size).num_steps

    def train_rows(self) -> int:
        """Rows of the training split (a partial last batch of an epoch is not trained)."""
        train = self.split("train")
        return len(train) if train is not None else 0

    def steps_per_epoch(self, batch_size: int) -> int:
        """Full global batches in one pass over the training split."""
        return self._order(batch_size).steps_per_epoch

    def _batch(self, split: Split, a: int, b: int) -> Batch:
        rows = self.read_rows(split.positions(a, b))
        keys = fuse_criteo_columns(rows.cats, self.hash_sizes)
        return Batch(
            dense=np.ascontiguousarray(rows.dense, dtype=np.float32),
            keys=keys,
            labels=rows.labels.astype(np.float32),
            bags={} if self.multi_hot is None else self.multi_hot.bags(keys & CRITEO_VALUE_MASK),
        )

    def worker_batch(self, step: int, batch_size: int, rank: int, world: int) -> Batch | None:
        """Worker ``rank``'s share of step ``step``'s global batch, read alone (random access),
        or None after the last step."""
        span = self._order(batch_size).positions(step, rank, world)
        if span is None:
            return None
        train = self.split("train")
        assert train is not None
        return self._batch(train, *span)

    def train_batches(self, batch_size: int, start_step: int = 0) -> Iterator[tuple[int, Batch]]:
        """``(step, global batch)`` from ``start_step`` to the end of the last epoch."""
        step = start_step
        while (batch := self.worker_batch(step, batch_size, 0, 1)) is not None:
            yield step, batch
            step += 1

    def _split_batches(
        self, name: str, batch_size: int, num_batches: int | None, partial: bool = False
    ) -> Iterator[Batch]:
        split = self.split(name)
        if split is None:
            return
        yield from self._batches_of(split, batch_size, num_batches, partial)

    def _batches_of(
        self, split: Split, batch_size: int, num_batches: int | None, partial: bool
    ) -> Iterator[Batch]:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        n = len(split) // batch_size
        if num_batches is not None:
            n = min(n, max(num_batches, 0))
        for i in range(n):
            yield self._batch(split, i * batch_size, (i + 1) * batch_size)
        if partial and num_batches is None and len(split) % batch_size:
            yield self._batch(split, n * batch_size, len(split))

    def eval_batches(self, batch_size: int, num_batches: int | None) -> Iterator[Batch]:
        """The first ``num_batches`` global batches of the eval split (fewer if it is short);
        None: every row of it, the last partial batch included, so the figures do not depend
        on the batch size."""
        return self._split_batches("eval", batch_size, num_batches, partial=True)

    def test_batches(self, batch_size: int, num_batches: int | None = None) -> Iterator[Batch]:
        """Global batches of the test split (None, the default: every row of it, the last
        partial batch included; none without a test split)."""
        return self._split_batches("test", batch_size, num_batches, partial=True)

    def split_batches(
        self, name: str, batch_size: int, num_batches: int | None = None
    ) -> Iterator[Batch]:
        """The first ``num_batches`` global batches of split ``name`` in file order (None:
        every row of it, the last partial batch included); ``"all"``: every row of the data
        (``python -m cpu_dist.serving --split``)."""
        if name == "all":
            all_rows = RowRange(0, self.num_rows)
            return self._batches_of(all_rows, batch_size, num_batches, partial=True)
        return self._split_batches(name, batch_size, num_batches, partial=True)

    def iter_batches(self, batch_size: int, split: str = "train") -> Iterator[Batch]:
        """Every full global batch of ``split`` once, in file order (no shuffling)."""
        if split not in ("train", "eval", "test"):
            raise ValueError(f"split must be 'train', 'eval' or 'test', got {split!r}")
        return self._split_batches(split, batch_size, None)
