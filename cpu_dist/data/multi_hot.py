"""Criteo made multi-hot, as MLPerf's DLRM-DCNv2 makes it (``--multi-hot-sizes``).

Each one-hot id of a Criteo feature becomes a bag of that feature's size: the id itself, then
``size - 1`` ids drawn uniformly from the feature's id space (its hash size, ``2**32`` where
none is given).  The draws are a pure function of ``(seed, feature, id)`` (a counter-based
hash, ``contracts.mix64``: SplitMix64), so a given id always brings the same bag, whichever worker
reads it, in whichever batch, at whatever worker count: the distributed run and the
single-process reference see the same bags.  MLPerf's reference precomputes these bags per
id with its own generator; the scheme (one fixed bag per id, uniform draws) is the same, the
bits are ours.

The drawn ids are in the data's id space, not a table's: a job file's table with
``num_embeddings`` folds them as it folds every id (``BatchFeatures``), so the bags do not
depend on how the tables are sized.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cpu_dist.common.config import MULTI_HOT_DISTRIBUTIONS
from cpu_dist.common.contracts import mix64
from cpu_dist.common.data_checks import check_sizes
from cpu_dist.data.batch import Bags

DISTRIBUTIONS = MULTI_HOT_DISTRIBUTIONS

_MASK = (1 << 64) - 1
_SALT = 0x6D756C7469686F74  # "multihot"
_GOLDEN = 0x9E3779B97F4A7C15


def _mix_int(x: int) -> int:
    """:func:`~cpu_dist.common.contracts.mix64` of one Python int (a salt, computed once)."""
    return int(mix64(np.array([x & _MASK], dtype=np.uint64))[0])


class MultiHot:
    """One-hot ids -> each feature's bags (see the module docstring).

    Args:
        sizes: one bag size per feature (1: the feature stays one-hot).
        hash_sizes: each feature's id space (the data's hash sizes): drawn ids are below it.
        names: the features' names, the keys of :meth:`bags`.
        seed: the job's seed.
        distribution: how the extra ids are drawn; ``"uniform"`` (MLPerf's) alone.

    Example::

        mh = MultiHot(MLPERF_SIZES, (2**32,) * 26, categorical_names(26), seed=0)
        bags = mh.bags(ids)  # ids: int64 [B, 26], each feature's own ids
        bags["cat_20"].lengths  # 100 for every sample
    """

    def __init__(
        self,
        sizes: Sequence[int],
        hash_sizes: Sequence[int],
        names: Sequence[str],
        seed: int,
        distribution: str = "uniform",
    ) -> None:
        if distribution not in DISTRIBUTIONS:
            raise ValueError(
                f"multi-hot distribution {distribution!r}: expected one of "
                f"{', '.join(DISTRIBUTIONS)}"
            )
        self.sizes = check_sizes(sizes, len(names), "multi-hot sizes")
        if len(hash_sizes) != len(names):
            raise ValueError(f"{len(hash_sizes)} hash sizes for {len(names)} features")
        self.hash_sizes = tuple(int(n) for n in hash_sizes)
        self.names = tuple(names)
        self.distribution = distribution
        base = _mix_int(int(seed) ^ _SALT)
        self._salts = [_mix_int(base + f * _GOLDEN) for f in range(len(names))]

    def bag_values(self, f: int, ids: np.ndarray) -> np.ndarray:
        """int64 ``[len(ids), sizes[f]]``: feature ``f``'s bag of each id, the id first."""
        ids = np.asarray(ids, dtype=np.int64)
        s = self.sizes[f]
        out = np.empty((ids.shape[0], s), dtype=np.int64)
        out[:, 0] = ids
        if s > 1:
            h = mix64(ids.astype(np.uint64) ^ np.uint64(self._salts[f]))
            steps = (np.arange(1, s, dtype=np.uint64) * np.uint64(_GOLDEN)).astype(np.uint64)
            with np.errstate(over="ignore"):
                drawn = mix64(h[:, None] + steps[None, :])
            drawn %= np.uint64(self.hash_sizes[f])
            out[:, 1:] = drawn.astype(np.int64)
        return out

    def bags(self, ids: np.ndarray) -> dict[str, Bags]:
        """Every feature of size > 1's bags, from the features' own ids ``[B, F]``."""
        ids = np.asarray(ids, dtype=np.int64)
        b = ids.shape[0]
        out = {}
        for f, s in enumerate(self.sizes):
            if s > 1:
                out[self.names[f]] = Bags(
                    lengths=np.full(b, s, dtype=np.int64),
                    values=self.bag_values(f, ids[:, f]).reshape(-1),
                )
        return out
