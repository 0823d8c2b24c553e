"""One global training batch, and each worker's slice of it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np


def _check_array(name: str, array: object, dtype: type, ndim: int) -> np.ndarray:
    """``array`` as it is, if it is a numpy array of ``dtype`` and ``ndim``; else a ValueError
    that names ``name`` (no silent conversion: a float id or an int32 length is a bug upstream).
    """
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(array).__name__}")
    if array.dtype != dtype or array.ndim != ndim:
        raise ValueError(
            f"{name} must be {np.dtype(dtype).name} with {ndim} dimension(s), "
            f"got {array.dtype} of shape {array.shape}"
        )
    return array


@dataclass(frozen=True)
class Bags:
    """One multi-hot (or weighted) feature's bags for the samples of a batch.

    Sample ``b``'s bag is ``values[o[b]:o[b+1]]`` with ``o`` the exclusive cumulative sum of
    ``lengths`` (:attr:`offsets`); an empty bag (length 0) is allowed and pools to zeros.  The
    values are the feature's own ids (synthetic data: in ``[0, card_f)``, not fused, no
    ``num_embeddings`` modulo): the id space ``TableKeySplit.ids()`` gives for one-hot ids, so
    ``BatchFeatures`` maps bag and one-hot ids alike.

    Args:
        lengths: int64 ``[B]``, every entry ``>= 0``.
        values: int64 ``[lengths.sum()]``, the bags' ids sample after sample.
        weights: float32 ``[lengths.sum()]``, one weight per id, or None (unweighted).

    Example::

        bags = Bags(
            lengths=np.array([2, 0, 1], np.int64),
            values=np.array([7, 3, 7], np.int64),
            weights=None,
        )
        bags.rows(1, 3).values  # array([7]): sample 1's empty bag, sample 2's bag
    """

    lengths: np.ndarray
    values: np.ndarray
    weights: np.ndarray | None = None

    def __post_init__(self) -> None:
        lengths = _check_array("Bags.lengths", self.lengths, np.int64, 1)
        _check_array("Bags.values", self.values, np.int64, 1)
        if lengths.size and int(lengths.min()) < 0:
            raise ValueError(f"Bags.lengths must be >= 0, got min {int(lengths.min())}")
        total = int(lengths.sum())
        if self.values.shape[0] != total:
            raise ValueError(
                f"Bags.values has {self.values.shape[0]} ids, the lengths add up to {total}"
            )
        if self.weights is not None:
            _check_array("Bags.weights", self.weights, np.float32, 1)
            if self.weights.shape[0] != total:
                raise ValueError(
                    f"Bags.weights has {self.weights.shape[0]} entries, the lengths add up "
                    f"to {total}"
                )

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def offsets(self) -> np.ndarray:
        """int64 ``[B + 1]``: sample ``b``'s bag is ``values[offsets[b]:offsets[b + 1]]``."""
        out = np.zeros(len(self) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=out[1:])
        return out

    def rows(self, lo: int, hi: int) -> Bags:
        """The bags of samples ``[lo, hi)`` (views, no copies): what a batch's slice holds."""
        _check_span(lo, hi, len(self))
        start = int(self.lengths[:lo].sum())
        stop = start + int(self.lengths[lo:hi].sum())
        return Bags(
            lengths=self.lengths[lo:hi],
            values=self.values[start:stop],
            weights=None if self.weights is None else self.weights[start:stop],
        )


def _check_span(lo: int, hi: int, b: int) -> None:
    if not 0 <= lo <= hi <= b:
        raise ValueError(f"bad row span [{lo}, {hi}) of a batch of {b} samples")


@dataclass(frozen=True)
class Batch:
    """A batch of Criteo-shaped samples.

    ``keys`` are already fused (see :mod:`cpu_dist.data.keys`), so the model never needs to
    know which feature a key came from.  Column f of ``keys`` is the categorical feature
    ``cat_f`` and column f of ``dense`` the dense feature ``int_f`` (TorchRec's names, the
    names a job file's tables use: ``factory.feature_names``).

    ``bags`` holds the multi-hot and weighted features (:class:`Bags`), keyed by feature name:
    a feature named there takes its ids (and weights) from its bags, and its column of
    ``keys`` is ignored (still filled, so every column stays in its feature's key range).  It
    is empty for one-hot data.  Slice a batch with :meth:`rows` or :meth:`shard`, never by
    hand, so that the bags are cut with the rows.
    """

    dense: np.ndarray  # float32 [B, num_dense]
    keys: np.ndarray  # int64 [B, num_sparse]
    labels: np.ndarray  # float32 [B]
    bags: Mapping[str, Bags] = field(default_factory=dict)

    def __post_init__(self) -> None:
        b = self.labels.shape[0]
        if self.dense.ndim != 2 or self.keys.ndim != 2 or self.labels.ndim != 1:
            raise ValueError("Batch wants dense [B, Fd], keys [B, Fs], labels [B]")
        if self.dense.shape[0] != b or self.keys.shape[0] != b:
            raise ValueError(
                f"batch sizes differ: dense {self.dense.shape}, keys {self.keys.shape}, "
                f"labels {self.labels.shape}"
            )
        for name, bag in self.bags.items():
            if not isinstance(name, str) or not isinstance(bag, Bags):
                raise ValueError(
                    f"Batch.bags maps feature names to Bags, got {name!r}: {type(bag).__name__}"
                )
            if len(bag) != b:
                raise ValueError(f"feature {name!r} has bags for {len(bag)} samples, batch has {b}")
        # A copy: the caller's dict changing later does not change the batch (a plain dict,
        # not a read-only proxy, so that a batch still pickles).
        object.__setattr__(self, "bags", dict(self.bags))

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def rows(self, lo: int, hi: int) -> Batch:
        """Samples ``[lo, hi)``: dense, keys, labels and every feature's bags cut alike.

        Any part of a batch (a worker's share, a held-out batch's slice) is made here, so a
        slice never keeps another slice's bags.
        """
        _check_span(lo, hi, len(self))
        return Batch(
            dense=self.dense[lo:hi],
            keys=self.keys[lo:hi],
            labels=self.labels[lo:hi],
            bags={name: bag.rows(lo, hi) for name, bag in self.bags.items()},
        )

    def shard(self, rank: int, world: int) -> Batch:
        """Rows ``[rank*B/W, (rank+1)*B/W)``: worker ``rank``'s part of the global batch.

        Contiguous slices keep the global batch the concatenation of the local ones in rank
        order, which is what lets the distributed run be compared with a single process.
        """
        b = len(self)
        if world <= 0 or not 0 <= rank < world:
            raise ValueError(f"bad rank/world: rank={rank}, world={world}")
        if b % world != 0:
            raise ValueError(f"global batch size {b} is not divisible by world size {world}")
        n = b // world
        return self.rows(rank * n, (rank + 1) * n)
