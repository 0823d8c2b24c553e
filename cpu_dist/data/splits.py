"""Which rows of a Criteo file form each split, and which of them make step t's batch.

Both file readers (the TSV reader and the converted layout) use these, so they cut the same
rows into the same batches:

- a split is an ordered subset of the rows (:class:`RowRange`, :class:`EveryKth`) with random
  access by position, so a batch, or one worker's share of it, is found without reading what
  comes before;
- :class:`BatchOrder` maps a step to a block of ``batch_size`` consecutive split positions:
  epoch ``e = step // steps_per_epoch``, block ``step % steps_per_epoch``, or with shuffling
  the block a permutation drawn from ``(seed, e)`` puts there.  The last partial block of an
  epoch is dropped, so every step has the full global batch; a worker's share is the
  contiguous slice ``[r*B/W, (r+1)*B/W)`` of it, as :meth:`Batch.shard` cuts it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# Lines of rows [lo, hi) of the file, int64, increasing (0-based physical line numbers).
LinesOf = Callable[[int, int], np.ndarray]

_CHUNK = 1 << 13  # rows per counted chunk of EveryKth
_SHUFFLE_SALT = 0x73687566  # "shuf"


class RowRange:
    """Rows ``[lo, hi)`` in order (the day-file splits; a whole file)."""

    def __init__(self, lo: int, hi: int) -> None:
        if not 0 <= lo <= hi:
            raise ValueError(f"bad row range [{lo}, {hi})")
        self.lo, self.hi = int(lo), int(hi)

    def __len__(self) -> int:
        return self.hi - self.lo

    def positions(self, a: int, b: int) -> np.ndarray:
        """Row indices of split positions ``[a, b)``."""
        if not 0 <= a <= b <= len(self):
            raise IndexError(f"positions [{a}, {b}) outside a split of {len(self)} rows")
        return np.arange(self.lo + a, self.lo + b, dtype=np.int64)


class EveryKth:
    """The one-file rule: a row whose 0-based physical line ``n`` has ``n % k == k - 1`` is in
    the eval split (``held_out=True``), every other row in the train split.

    Counted per chunk of rows once (one pass over the line numbers), then a position is found
    by a binary search over the chunks and a scan of one or two chunks."""

    def __init__(self, lines_of: LinesOf, num_rows: int, k: int, held_out: bool) -> None:
        if k < 2:
            raise ValueError(f"every-k-th-line split needs k >= 2, got {k}")
        self.lines_of, self.num_rows, self.k, self.held_out = lines_of, int(num_rows), k, held_out
        counts = [
            int(np.count_nonzero(self._mask(lo, min(lo + _CHUNK, self.num_rows))))
            for lo in range(0, self.num_rows, _CHUNK)
        ]
        self.prefix = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)

    def _mask(self, lo: int, hi: int) -> np.ndarray:
        lines = self.lines_of(lo, hi)
        is_eval = lines % self.k == self.k - 1
        return is_eval if self.held_out else ~is_eval

    def __len__(self) -> int:
        return int(self.prefix[-1])

    def positions(self, a: int, b: int) -> np.ndarray:
        if not 0 <= a <= b <= len(self):
            raise IndexError(f"positions [{a}, {b}) outside a split of {len(self)} rows")
        out = []
        chunk = int(np.searchsorted(self.prefix, a, side="right")) - 1
        skip, need = a - int(self.prefix[chunk]), b - a
        while need > 0:
            lo = chunk * _CHUNK
            rows = lo + np.flatnonzero(self._mask(lo, min(lo + _CHUNK, self.num_rows)))
            got = rows[skip : skip + need]
            out.append(got)
            need -= len(got)
            skip, chunk = 0, chunk + 1
        return np.concatenate(out).astype(np.int64) if out else np.zeros(0, np.int64)


Split = RowRange | EveryKth


class BatchOrder:
    """Steps of ``epochs`` passes (``None``: endless) over a split of ``split_rows`` rows."""

    def __init__(
        self, split_rows: int, batch_size: int, epochs: int | None, shuffle: bool, seed: int
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        self.batch_size = batch_size
        self.steps_per_epoch = split_rows // batch_size
        self.epochs, self.shuffle, self.seed = epochs, shuffle, seed
        self.num_steps = None if epochs is None else epochs * self.steps_per_epoch
        self._cached: tuple[int, np.ndarray] | None = None

    def block(self, step: int) -> int | None:
        """The block of split positions step ``step`` trains on, or None past the last step."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if self.steps_per_epoch == 0 or (self.num_steps is not None and step >= self.num_steps):
            return None
        epoch, i = divmod(step, self.steps_per_epoch)
        return int(self._permutation(epoch)[i]) if self.shuffle else i

    def _permutation(self, epoch: int) -> np.ndarray:
        """The block order of ``epoch``: a pure function of (seed, epoch, steps per epoch)."""
        cached = self._cached
        if cached is None or cached[0] != epoch:
            rng = np.random.default_rng([self.seed & (2**64 - 1), _SHUFFLE_SALT, epoch])
            cached = self._cached = (epoch, rng.permutation(self.steps_per_epoch))
        return cached[1]

    def positions(self, step: int, rank: int = 0, world: int = 1) -> tuple[int, int] | None:
        """Split positions ``[a, b)`` of worker ``rank``'s share of step ``step``'s batch."""
        if world <= 0 or not 0 <= rank < world or self.batch_size % world:
            raise ValueError(
                f"bad share: rank {rank} of {world} workers, global batch {self.batch_size}"
            )
        block = self.block(step)
        if block is None:
            return None
        share = self.batch_size // world
        a = block * self.batch_size + rank * share
        return a, a + share
