"""A deterministic, Criteo-shaped synthetic click stream with a learnable hidden model.

Why synthetic: the real Criteo logs are tens of GB; tests, demos and benchmarks on a 2-core
machine need data that costs nothing to ship, can be regenerated anywhere, and shows whether
a model learns. Every batch is a pure function of ``(seed, split, step, batch_size)``, so a
resumed run or the single-process reference sees exactly the batches of the original run,
without reading any earlier ones.

The generative model:

- Dense features: a latent ``z ~ N(0, 1)`` per (sample, feature) becomes a log-normal count
  ``floor(exp(mu_j + sigma_j * z))`` that is then ``log1p``-transformed, the way the Criteo
  reader transforms real counts. Observed values are therefore non-negative and skewed, like
  the real thing, while the hidden model uses the latent ``z``.
- Sparse features: the popularity rank ``r`` of an id of feature f is bounded-Zipf
  distributed over ``[0, card_f)`` (exact inverse CDF), then ``id = (a_f * r + c_f) mod
  card_f`` with ``a_f`` coprime to ``card_f`` (both from a hash of the seed): a bijection, so
  the hot ids are spread over the range instead of being 0..k.
- Labels: ``logit = bias + sum_j w_j z_j + sum_f g * h(key_f)`` where ``h`` is a hidden scalar
  of unit variance computed from a hash of the fused key, and the label is a Bernoulli draw
  of ``sigmoid(logit)``. The sparse part is learnable for ids that recur, which under Zipf are
  the ones that carry most of the traffic.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence

import numpy as np

from cpu_dist.common.contracts import mix64
from cpu_dist.data.batch import Batch
from cpu_dist.data.keys import fuse_synthetic, synthetic_offsets

# Roughly the shape of Criteo Kaggle's 26 cardinalities (a handful of huge features, many
# small ones) with the huge ones cut to 1e5-1e6 so that a 2-core machine copes: 200 steps at
# batch 2048 with the default exponent touch about 0.59 M distinct keys out of 3.5 M.
DEFAULT_CARDINALITIES: tuple[int, ...] = (
    1460,
    583,
    1_000_000,
    200_000,
    305,
    24,
    12517,
    633,
    3,
    50_000,
    5683,
    800_000,
    3194,
    27,
    14992,
    500_000,
    10,
    5652,
    2173,
    4,
    700_000,
    18,
    15,
    100_000,
    105,
    100_000,
)

_SPLIT_CODES = {"train": 1, "eval": 2, "test": 3}
_HIDDEN_SALT = 0x68696464656E  # "hidden": separates the label hash from other uses of seed
_PERM_SALT = 0x7065726D  # "perm"
_MAX_CARDINALITY = 2**31


@functools.lru_cache(maxsize=64)
def _zipf_cdf(cardinality: int, exponent: float) -> np.ndarray:
    """Exact CDF of the bounded Zipf law over ranks ``0..card-1`` (shared, read-only).

    Cached because several datasets in one process (trainer and reference, tests) use the
    same cardinalities, and the largest table costs ~8 MB and ~30 ms to build.
    """
    w = np.arange(1, cardinality + 1, dtype=np.float64) ** (-exponent)
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    cdf[-1] = 1.0
    cdf.flags.writeable = False
    return cdf


def _hash_uniform(seed: int, salt: int, values: np.ndarray) -> np.ndarray:
    """Counter-based uniform floats in [0, 1) from (seed, salt, value): 53-bit precision."""
    s = mix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) ^ np.uint64(salt))
    bits = mix64(s ^ np.asarray(values).astype(np.int64).view(np.uint64))
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


# Batches "all of" the endless eval or test stream means (--eval-batches -1, --test-batches -1).
HELD_OUT_BATCHES = 4


class SyntheticCriteo:
    """Deterministic Criteo-like batches with random access by step (see module docstring)."""

    kind = "synthetic"

    def __init__(
        self,
        cardinalities: Sequence[int] | None = None,
        zipf_exponent: float = 1.05,
        seed: int = 0,
        num_dense: int = 13,
        num_sparse: int = 26,
        *,
        dense_signal: float = 1.0,
        sparse_signal: float = 1.5,
        bias: float = -1.3,
    ) -> None:
        if cardinalities is None:
            base = DEFAULT_CARDINALITIES
            cardinalities = [base[i % len(base)] for i in range(num_sparse)]
        cardinalities = [int(c) for c in cardinalities]
        if len(cardinalities) != num_sparse:
            raise ValueError(
                f"{len(cardinalities)} cardinalities given for {num_sparse} sparse features"
            )
        if any(c <= 0 or c > _MAX_CARDINALITY for c in cardinalities):
            raise ValueError(f"cardinalities must be in [1, 2**31], got {cardinalities}")
        if zipf_exponent <= 0:
            raise ValueError(f"zipf_exponent must be positive, got {zipf_exponent}")
        if num_dense < 0 or num_sparse <= 0:
            raise ValueError("need num_dense >= 0 and num_sparse >= 1")
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        self.cardinalities = cardinalities
        self.zipf_exponent = float(zipf_exponent)
        self.seed = int(seed)
        self.num_dense = int(num_dense)
        self.num_sparse = int(num_sparse)
        self.offsets = synthetic_offsets(cardinalities)
        self.num_keys = int(sum(cardinalities))

        hidden = np.random.default_rng([self.seed, _HIDDEN_SALT])
        # Count distributions of the dense features: medians from 1 to ~1000, varied spread.
        self._dense_mu = hidden.uniform(0.0, 7.0, size=num_dense)
        self._dense_sigma = hidden.uniform(0.5, 2.0, size=num_dense)
        w = hidden.standard_normal(num_dense)
        norm = max(float(np.linalg.norm(w)), 1e-12)
        self._dense_w = w * (dense_signal / norm) if num_dense else w
        self._sparse_gain = sparse_signal / math.sqrt(num_sparse)
        self._bias = float(bias)
        self._perm_a, self._perm_c = self._permutations()
        for card in set(cardinalities):  # built now, not in the first batch a trainer waits for
            _zipf_cdf(card, self.zipf_exponent)

    def _permutations(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-feature affine bijection ``rank -> (a*rank + c) mod card`` from a hash of seed."""
        u = _hash_uniform(self.seed, _PERM_SALT, np.arange(2 * self.num_sparse))
        a_list, c_list = [], []
        for f, card in enumerate(self.cardinalities):
            a = 1 + min(int(u[2 * f] * (card - 1)), card - 2) if card > 2 else 1
            while math.gcd(a, card) != 1:  # 1 is coprime to everything: this ends
                a = a % (card - 1) + 1
            a_list.append(a)
            c_list.append(min(int(u[2 * f + 1] * card), card - 1))
        return np.array(a_list, dtype=np.int64), np.array(c_list, dtype=np.int64)

    def hidden_scalar(self, keys: np.ndarray) -> np.ndarray:
        """The hidden model's per-key contribution (unit variance, before the gain)."""
        u = _hash_uniform(self.seed, _HIDDEN_SALT, keys)
        return (u * 2.0 - 1.0) * math.sqrt(3.0)

    def sample_ids(self, rng: np.random.Generator, batch_size: int) -> np.ndarray:
        """Per-feature ids ``[B, F]`` int64 (not yet fused)."""
        ids = np.empty((batch_size, self.num_sparse), dtype=np.int64)
        u = rng.random((self.num_sparse, batch_size))
        for f, card in enumerate(self.cardinalities):
            rank = np.searchsorted(_zipf_cdf(card, self.zipf_exponent), u[f], side="right")
            np.minimum(rank, card - 1, out=rank)  # u < 1 always, this only guards rounding
            ids[:, f] = (self._perm_a[f] * rank + self._perm_c[f]) % card
        return ids

    def global_batch(self, step: int, batch_size: int, split: str = "train") -> Batch:
        """The global batch at ``step``: a pure function of (seed, split, step, batch_size)."""
        if split not in _SPLIT_CODES:
            raise ValueError(f"split must be 'train', 'eval' or 'test', got {split!r}")
        if step < 0 or batch_size <= 0:
            raise ValueError(
                f"need step >= 0 and batch_size > 0, got step={step}, batch_size={batch_size}"
            )
        rng = np.random.default_rng([self.seed, _SPLIT_CODES[split], int(step), int(batch_size)])
        z = rng.standard_normal((batch_size, self.num_dense))
        counts = np.floor(np.exp(self._dense_mu + self._dense_sigma * z))
        dense = np.log1p(counts).astype(np.float32)
        keys = fuse_synthetic(self.sample_ids(rng, batch_size), self.offsets)
        logit = self._bias + z @ self._dense_w
        logit += self._sparse_gain * self.hidden_scalar(keys).sum(axis=1)
        p = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(batch_size) < p).astype(np.float32)
        return Batch(dense=dense, keys=keys, labels=labels)

    def train_batches(self, batch_size: int, start_step: int = 0) -> Iterator[tuple[int, Batch]]:
        """Endless ``(step, batch)`` from ``start_step`` on."""
        step = start_step
        while True:
            yield step, self.global_batch(step, batch_size, "train")
            step += 1

    def worker_batch(self, step: int, batch_size: int, rank: int, world: int) -> Batch:
        """Worker ``rank``'s share of step ``step``'s global batch (the stream never ends).

        The whole global batch is generated and cut: a share alone is not a function of the
        step, and generating costs a few milliseconds, off the training thread (``loader.py``).
        """
        return self.global_batch(step, batch_size, "train").shard(rank, world)

    def eval_batches(self, batch_size: int, num_batches: int | None) -> Iterator[Batch]:
        """The first ``num_batches`` (None: ``HELD_OUT_BATCHES``, the stream has no end)
        batches of the independent eval stream."""
        for i in range(HELD_OUT_BATCHES if num_batches is None else num_batches):
            yield self.global_batch(i, batch_size, "eval")

    def test_batches(self, batch_size: int, num_batches: int | None = None) -> Iterator[Batch]:
        """The first ``num_batches`` (default 4) batches of the independent test stream."""
        for i in range(HELD_OUT_BATCHES if num_batches is None else num_batches):
            yield self.global_batch(i, batch_size, "test")
