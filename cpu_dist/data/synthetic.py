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
- Multi-hot and weighted features (``bags``, ``weights``; :class:`~cpu_dist.data.batch.Bags`):
  a feature named in ``bags`` with ``(MIN, MAX)`` gets bag lengths uniform in ``[MIN, MAX]``
  (0 allowed: empty bags) and ids from its own Zipf stream (its cardinality, its
  permutation: the law of its one-hot ids); a feature named in ``weights`` gets a weight
  uniform in ``[0.5, 1.5)`` per id (float32; a weighted one-hot feature is a bag of one
  holding its one-hot id).  Its term in the logit is then ``g * sum_i w_i h(key_i) / len``
  over its bag (``w = 1`` unweighted, 0 for an empty bag, ``key_i = offset[f] + id_i``, so a
  bag of one is the one-hot term).  These numbers come from generators of their own, one per
  (seed, split, step, batch_size, feature), never from the one-hot stream's: a job without
  bags and weights gets the same batches bit for bit, and adding a feature's bags leaves
  every other feature's bags as they were.  The bagged feature's column of ``keys`` keeps the
  one-hot draw (ignored by the model, see :class:`~cpu_dist.data.batch.Batch`).
- Features of any name (``features``: a job file's tables name them): ``cat_0 ... cat_25``
  are the stream above, bit for bit, whichever of them are named (the batch's columns are the
  named ones; the others are drawn as before and not used); any other name is a Zipf stream
  of its own over its cardinality (``named_cardinalities``, default
  :data:`DEFAULT_NAMED_CARDINALITY`), its permutation, ids, bags and weights from generators
  seeded by (seed, split, step, batch_size, a stable hash of the name): deterministic in
  (seed, name) and unchanged by the other features named.  The label's sparse term sums over
  the named features (gain ``sparse_signal / sqrt(F)``), an other name's hidden scalar keyed by
  its name and id, so a job learns from exactly the features it has.  The default job, and any
  job naming ``cat_0 ... cat_25`` in order, gets today's batches bit for bit.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from cpu_dist.common.contracts import mix64
from cpu_dist.common.features import MAX_NAMED_CARDINALITY, NAMED_CARDINALITY, categorical_names
from cpu_dist.data.batch import Bags, Batch
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
_BAGS_SALT = 0x62616773  # "bags": the generators of bag lengths, bag ids and weights
_NAMED_SALT = 0x6E616D6564  # "named": the generators of a feature of another name
_WEIGHT_RANGE = (0.5, 1.5)  # per-id weights of a weighted feature, uniform in [lo, hi)
_MAX_CARDINALITY = 2**31
# A feature of another name than cat_0 ... cat_25 without a cardinality of its own (a job
# file's [data] cardinalities, else its table's num_embeddings), and the largest.
DEFAULT_NAMED_CARDINALITY = NAMED_CARDINALITY


def name_hash(name: str) -> int:
    """A feature name's 64-bit hash, the same in every process and Python version (blake2b,
    not ``hash()``, which is salted per process): what seeds a named feature's stream."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def _affine(u0: float, u1: float, card: int) -> tuple[int, int]:
    """``(a, c)`` of a bijection ``rank -> (a*rank + c) mod card`` from two uniforms."""
    a = 1 + min(int(u0 * (card - 1)), card - 2) if card > 2 else 1
    while math.gcd(a, card) != 1:  # 1 is coprime to everything: this ends
        a = a % (card - 1) + 1
    return a, min(int(u1 * card), card - 1)


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


_GUIDE_MIN_BITS, _GUIDE_MAX_BITS = 10, 20  # a guide of 2**10 .. 2**20 buckets (4 KB .. 4 MB)


@functools.lru_cache(maxsize=64)
def _zipf_guide(cardinality: int, exponent: float) -> tuple[np.ndarray, int]:
    """A guide table for inverting :func:`_zipf_cdf` fast, exactly as ``searchsorted`` would.

    ``guide[j]`` is the rank ``searchsorted(cdf, j / K, "right")`` (at most ``card - 1``) for
    ``K = len(guide) - 1`` buckets, a power of two: then ``j = floor(u * K)`` is exact in
    floating point, ``j / K <= u < (j + 1) / K``, and the rank of ``u`` lies in ``[guide[j],
    guide[j + 1]]``, which ``passes`` halvings of a vectorised binary search narrow to one.
    Why: numpy's ``searchsorted`` costs ~80 ns per unsorted query into a 1e6-entry CDF
    (a cache miss and a branch mispredicted per level); with a guide of 1 K-1 M buckets
    (1 to 4 per rank) most queries need no search at all and the rest a few halvings: a
    few times faster, for one-hot ids and bag ids alike.

    Returns:
        ``(guide int32 [K + 1], passes)``.
    """
    cdf = _zipf_cdf(cardinality, exponent)
    bits = min(max((cardinality - 1).bit_length() + 1, _GUIDE_MIN_BITS), _GUIDE_MAX_BITS)
    k = 1 << bits
    # searchsorted(cdf, j / K, "right") for every j at once: cdf[i] <= j / K iff j >=
    # ceil(cdf[i] * K) (exact: K is a power of two), so count the ceilings and add them up.
    counts = np.bincount(np.ceil(cdf * k).astype(np.int64), minlength=k + 1)
    guide = np.minimum(np.cumsum(counts), cardinality - 1).astype(np.int32)
    guide.flags.writeable = False
    return guide, int(np.max(guide[1:] - guide[:-1])).bit_length()


def _zipf_ranks(cardinality: int, exponent: float, u: np.ndarray) -> np.ndarray:
    """Zipf ranks int64 of uniforms ``u`` in [0, 1): ``min(searchsorted(cdf, u, "right"),
    card - 1)`` exactly (the same integers, :func:`_zipf_guide` says why), only faster."""
    cdf = _zipf_cdf(cardinality, exponent)
    guide, passes = _zipf_guide(cardinality, exponent)
    j = (u * (guide.shape[0] - 1)).astype(np.int64)  # exact: K is a power of two
    rank = guide[j].astype(np.int64)
    hi = guide[j + 1].astype(np.int64)
    # Only a bucket that holds a rank boundary needs a search: under Zipf the head's buckets
    # mostly hold none, so this is the tail's fraction of the queries.
    todo = np.flatnonzero(hi > rank)
    if todo.size:
        lo, hi, v = rank[todo], hi[todo], u[todo]
        for _ in range(passes):  # invariant: the rank is in [lo, hi]
            mid = (lo + hi) >> 1
            right = cdf[mid] <= v
            lo = np.where(right, mid + 1, lo)
            hi = np.where(right, hi, mid)
        rank[todo] = lo
    return rank


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
        bags: Mapping[str, tuple[int, int]] | None = None,
        weights: Sequence[str] = (),
        features: Sequence[str] | None = None,
        named_cardinalities: Mapping[str, int] | None = None,
    ) -> None:
        """Args (the keyword ones that shape the sparse features):
            bags: ``{feature: (MIN, MAX)}``, the multi-hot features (``cat_0`` ...: the
                names of ``factory.feature_names``) and their bag-length ranges.
            weights: the features whose ids carry a weight each.
            features: the batch's categorical columns, by name (None: ``cat_0`` ...
                ``cat_{num_sparse-1}``); see the module docstring.
            named_cardinalities: ``{name: N}`` of features of other names (default
                :data:`DEFAULT_NAMED_CARDINALITY`).

        Example::

            data = SyntheticCriteo(seed=1, bags={"cat_3": (0, 20)}, weights=["cat_3", "cat_7"])
            batch = data.global_batch(0, 4096)
            batch.bags["cat_3"].lengths  # int64 [4096], each in [0, 20]
        """
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
        self.zipf_exponent = float(zipf_exponent)
        self.seed = int(seed)
        self.num_dense = int(num_dense)
        self._num_base = int(num_sparse)  # the Criteo-shaped stream's features, cat_0 ...
        base_names = categorical_names(self._num_base)
        names = base_names if features is None else tuple(features)
        self._columns(names, cardinalities, dict(named_cardinalities or {}))
        self.num_sparse = len(names)
        self.sparse_names = names
        self.bags, self.weights = _check_bags(self.sparse_names, bags, weights)
        # The features that get Bags, as (column, name) in column order.
        bagged = set(self.bags) | set(self.weights)
        self._bagged = [(f, n) for f, n in enumerate(self.sparse_names) if n in bagged]

        hidden = np.random.default_rng([self.seed, _HIDDEN_SALT])
        # Count distributions of the dense features: medians from 1 to ~1000, varied spread.
        self._dense_mu = hidden.uniform(0.0, 7.0, size=num_dense)
        self._dense_sigma = hidden.uniform(0.5, 2.0, size=num_dense)
        w = hidden.standard_normal(num_dense)
        norm = max(float(np.linalg.norm(w)), 1e-12)
        self._dense_w = w * (dense_signal / norm) if num_dense else w
        self._sparse_gain = sparse_signal / math.sqrt(self.num_sparse)
        self._bias = float(bias)
        base_a, base_c = self._permutations(self._base_cards)
        perm = []
        for k, h, card in zip(self._base_of, self._hashes, self.cardinalities):
            if k >= 0:  # a cat_k: the stream's own permutation
                perm.append((int(base_a[k]), int(base_c[k])))
            else:  # a named feature's, from its name's hash
                u = _hash_uniform(self.seed, _PERM_SALT ^ h, np.arange(2))
                perm.append(_affine(float(u[0]), float(u[1]), card))
        self._perm_a = np.array([a for a, _ in perm], dtype=np.int64)
        self._perm_c = np.array([c for _, c in perm], dtype=np.int64)
        for card in set(
            self.cardinalities
        ):  # built now, not in the first batch a trainer waits for
            _zipf_guide(card, self.zipf_exponent)

    def _columns(
        self, names: Sequence[str], base_cards: Sequence[int], named: Mapping[str, int]
    ) -> None:
        """Each column's source: ``_base_of[j]`` the ``cat_k`` it is (-1: a named stream, its
        name's hash ``_hashes[j]``), its cardinality and key offset (a ``cat_k``'s as in the
        default job; a named feature's after every ``cat_k``'s, in column order)."""
        if not names or len(set(names)) != len(names):
            raise ValueError(f"features must be distinct names, at least one, got {names!r}")
        unknown = sorted(set(named) - set(names))
        if unknown:
            raise ValueError(f"named_cardinalities names {unknown[0]!r}, which is no feature")
        base = {n: k for k, n in enumerate(categorical_names(self._num_base))}
        base_offsets = synthetic_offsets(base_cards)
        self._base_cards = list(base_cards)
        self._base_of, self._hashes, cards, offsets = [], [], [], []
        end = int(sum(base_cards))
        for name in names:
            k = base.get(name, -1)
            self._base_of.append(k)
            if k >= 0:
                if name in named:
                    raise ValueError(f"{name!r} keeps the stream's own cardinality")
                self._hashes.append(0)
                cards.append(int(base_cards[k]))
                offsets.append(int(base_offsets[k]))
                continue
            card = int(named.get(name, DEFAULT_NAMED_CARDINALITY))
            if not 1 <= card <= MAX_NAMED_CARDINALITY:
                raise ValueError(
                    f"feature {name!r}: cardinality {card} must be in [1, {MAX_NAMED_CARDINALITY}]"
                )
            self._hashes.append(name_hash(name))
            cards.append(card)
            offsets.append(end)
            end += card
        self.cardinalities = cards
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.num_keys = end  # the key space: every cat_k's, then the named ones'

    def _permutations(self, cardinalities: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Per-feature affine bijection ``rank -> (a*rank + c) mod card`` from a hash of seed."""
        u = _hash_uniform(self.seed, _PERM_SALT, np.arange(2 * len(cardinalities)))
        pairs = [_affine(u[2 * f], u[2 * f + 1], card) for f, card in enumerate(cardinalities)]
        return (
            np.array([a for a, _ in pairs], dtype=np.int64),
            np.array([c for _, c in pairs], dtype=np.int64),
        )

    def hidden_scalar(self, keys: np.ndarray) -> np.ndarray:
        """The hidden model's per-key contribution (unit variance, before the gain)."""
        u = _hash_uniform(self.seed, _HIDDEN_SALT, keys)
        return (u * 2.0 - 1.0) * math.sqrt(3.0)

    def column_hidden(self, f: int, ids: np.ndarray) -> np.ndarray:
        """:meth:`hidden_scalar` of column ``f``'s ids: a ``cat_k``'s by its fused key, a
        named feature's by (its name, the id), whatever else the job names."""
        if self._base_of[f] >= 0:
            return self.hidden_scalar(np.asarray(ids, dtype=np.int64) + self.offsets[f])
        u = _hash_uniform(self.seed, _HIDDEN_SALT ^ self._hashes[f], ids)
        return (u * 2.0 - 1.0) * math.sqrt(3.0)

    def _named_rng(self, f: int, split_code: int, step: int, batch_size: int):
        """The generator of named column ``f``'s ids, bags and weights in one batch."""
        key = [self.seed, _NAMED_SALT, split_code, int(step), int(batch_size), self._hashes[f]]
        return np.random.default_rng(key)

    def feature_ids(self, f: int, u: np.ndarray) -> np.ndarray:
        """Feature ``f``'s ids (int64, not fused) for uniforms ``u`` in [0, 1): the Zipf rank
        by the exact inverse CDF, then the feature's permutation.  One-hot ids and bag ids
        both come from here, so a feature's ids follow one law."""
        card = self.cardinalities[f]
        rank = _zipf_ranks(card, self.zipf_exponent, u)
        return (self._perm_a[f] * rank + self._perm_c[f]) % card

    def sample_ids(self, rng: np.random.Generator, batch_size: int) -> np.ndarray:
        """Per-feature ids ``[B, F]`` int64 (not yet fused) of the ``cat_k`` columns: every
        ``cat_k``'s uniforms are drawn (the stream's), those of named columns are 0 here."""
        ids = np.zeros((batch_size, self.num_sparse), dtype=np.int64)
        u = rng.random((self._num_base, batch_size))
        for f, k in enumerate(self._base_of):
            if k >= 0:
                ids[:, f] = self.feature_ids(f, u[k])
        return ids

    def feature_bags(
        self,
        f: int,
        split_code: int,
        step: int,
        batch_size: int,
        one_hot: np.ndarray,
        rng: np.random.Generator | None = None,
    ) -> Bags:
        """Feature ``f``'s bags in a batch, from the feature's own generator (module
        docstring; ``rng``: a named column's, after its one-hot draw); ``one_hot``: its
        one-hot ids ``[B]``, the bag of a weighted one-hot feature."""
        name = self.sparse_names[f]
        if rng is None:  # a cat_k: seeded by its place in the stream, whatever else is named
            rng = np.random.default_rng(
                [self.seed, _BAGS_SALT, split_code, int(step), int(batch_size), self._base_of[f]]
            )
        span = self.bags.get(name)
        if span is None:  # weighted one-hot: a bag of one, the one-hot id
            lengths = np.ones(batch_size, dtype=np.int64)
            values = np.ascontiguousarray(one_hot, dtype=np.int64)
        else:
            lengths = rng.integers(span[0], span[1] + 1, size=batch_size, dtype=np.int64)
            values = self.feature_ids(f, rng.random(int(lengths.sum())))
        weights = None
        if name in self.weights:
            low, high = _WEIGHT_RANGE
            weights = np.asarray(rng.uniform(low, high, size=values.shape[0]), np.float32)
        return Bags(lengths=lengths, values=values, weights=weights)

    def bag_signal(self, f: int, bags: Bags) -> np.ndarray:
        """The hidden model's term of feature ``f`` per sample (before the gain): the mean
        over its bag of ``w * h(offset[f] + id)``, 0 for an empty bag."""
        h = self.column_hidden(f, bags.values)
        if bags.weights is not None:
            h = h * bags.weights
        sample = np.repeat(np.arange(len(bags), dtype=np.int64), bags.lengths)
        sums = np.bincount(sample, weights=h, minlength=len(bags))
        return sums / np.maximum(bags.lengths, 1)

    def global_batch(self, step: int, batch_size: int, split: str = "train") -> Batch:
        """The global batch at ``step``: a pure function of (seed, split, step, batch_size)."""
        if split not in _SPLIT_CODES:
            raise ValueError(f"split must be 'train', 'eval' or 'test', got {split!r}")
        if step < 0 or batch_size <= 0:
            raise ValueError(
                f"need step >= 0 and batch_size > 0, got step={step}, batch_size={batch_size}"
            )
        code = _SPLIT_CODES[split]
        rng = np.random.default_rng([self.seed, code, int(step), int(batch_size)])
        z = rng.standard_normal((batch_size, self.num_dense))
        counts = np.floor(np.exp(self._dense_mu + self._dense_sigma * z))
        dense = np.log1p(counts).astype(np.float32)
        ids = self.sample_ids(rng, batch_size)
        named = {}  # their own generators: rng's sequence is untouched
        for f, k in enumerate(self._base_of):
            if k < 0:
                named[f] = self._named_rng(f, code, step, batch_size)
                ids[:, f] = self.feature_ids(f, named[f].random(batch_size))
        keys = fuse_synthetic(ids, self.offsets)
        hidden = self.hidden_scalar(keys)
        for f in named:
            hidden[:, f] = self.column_hidden(f, ids[:, f])
        bags: dict[str, Bags] = {}
        for f, name in self._bagged:
            bags[name] = self.feature_bags(f, code, step, batch_size, ids[:, f], named.get(f))
            hidden[:, f] = self.bag_signal(f, bags[name])
        logit = self._bias + z @ self._dense_w
        logit += self._sparse_gain * hidden.sum(axis=1)
        p = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(batch_size) < p).astype(np.float32)
        return Batch(dense=dense, keys=keys, labels=labels, bags=bags)

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


def _check_bags(
    names: Sequence[str],
    bags: Mapping[str, tuple[int, int]] | None,
    weights: Sequence[str],
) -> tuple[dict[str, tuple[int, int]], tuple[str, ...]]:
    """``bags`` and ``weights`` checked against the feature names, in column order; a
    ValueError names the feature and what is wrong with it."""
    known = ", ".join(names)
    order = {n: i for i, n in enumerate(names)}
    out: dict[str, tuple[int, int]] = {}
    for name, span in (bags or {}).items():
        if name not in order:
            raise ValueError(
                f"bags names feature {name!r}, which the synthetic data has not "
                f"(its features: {known})"
            )
        pair = tuple(span) if isinstance(span, (tuple, list)) else (span,)
        if len(pair) != 2 or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in pair
        ):
            raise ValueError(
                f"bags of feature {name!r} must be [MIN, MAX] (two ints), got {span!r}"
            )
        lo, hi = int(pair[0]), int(pair[1])
        if not 0 <= lo <= hi:
            raise ValueError(
                f"bags of feature {name!r} must have 0 <= MIN <= MAX, got [{lo}, {hi}]"
            )
        out[name] = (lo, hi)
    if isinstance(weights, str):
        raise ValueError(f"weights must be a list of feature names, got the string {weights!r}")
    for name in weights:
        if name not in order:
            raise ValueError(
                f"weights names feature {name!r}, which the synthetic data has not "
                f"(its features: {known})"
            )
    ordered_bags = {n: out[n] for n in sorted(out, key=order.__getitem__)}
    return ordered_bags, tuple(sorted(set(weights), key=order.__getitem__))
