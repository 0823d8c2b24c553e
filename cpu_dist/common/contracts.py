"""The numpy twins of the parameter server's contracts: the hashes and first-touch rows of
``cpu_dist/sparse/csrc/hashing.h`` and the row optimizers of ``csrc/optimizer.h``.

The single-process reference model must start from exactly the rows the parameter server
creates on first touch, tools must know which shard owns a key without asking one, and a
serving process must score without the native module at all: so the contracts exist here in
plain numpy, and ``cpu_dist/sparse/tests/test_contracts.py`` holds them equal to the C++ ones
bit for bit.  See docs/DESIGN.md, "Contracts".
"""

from __future__ import annotations

import math

import numpy as np

# The one table of a job: every sparse feature's keys live in one fused key space.
TABLE = "embedding"
NUM_PARTITIONS = 4096
PARTITION_SALT = np.uint64(0x5BD1E9955BD1E995)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer on uint64 arrays (wrapping arithmetic)."""
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = z + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _as_u64(keys) -> np.ndarray:
    return np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64)


_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3


def table_salt(table: str = TABLE) -> int:
    """The salt that keys ``row_init`` and ``partition_of`` by table (csrc/hashing.h): 0 for
    the default table ``"embedding"`` (today's functions bit for bit), else
    ``mix64(fnv1a64(name))``."""
    if table == TABLE:
        return 0
    h = _FNV_OFFSET
    for b in table.encode():
        h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return int(mix64(np.array([h], dtype=np.uint64))[0])


def row_init(seed: int, keys, dim: int, scale: float, table: str = TABLE) -> np.ndarray:
    """First-touch rows ``[len(keys), dim]`` float32 of ``table``, equal to the PS's bit for
    bit."""
    k = _as_u64(keys).reshape(-1, 1)
    seed64 = np.array([seed], dtype=np.uint64) ^ np.uint64(table_salt(table))
    base = mix64(mix64(seed64) ^ k)
    cols = np.arange(dim, dtype=np.uint64).reshape(1, -1)
    bits = mix64(base ^ cols)
    u = (bits >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)
    return (u * np.float32(2.0) - np.float32(1.0)) * np.float32(scale)


def default_init_scale(dim: int) -> float:
    """The init scale of jobs and standalone shards alike unless one is given: 1/sqrt(dim)."""
    return 1.0 / math.sqrt(dim)


def partition_of(keys, table: str = TABLE) -> np.ndarray:
    salted = _as_u64(keys) ^ np.uint64(table_salt(table))
    return (mix64(salted ^ PARTITION_SALT) % np.uint64(NUM_PARTITIONS)).astype(np.int64)


def shard_of(keys, num_shards: int, table: str = TABLE) -> np.ndarray:
    return partition_of(keys, table) % num_shards


# Adagrad's default eps (csrc/optimizer.h kDefaultAdagradEps); a table's spec may name another.
ADAGRAD_EPS = 1e-8


def state_floats(kind: str, dim: int) -> int:
    """Floats of optimizer state a row keeps (csrc/optimizer.h): ``dim`` for Adagrad, else 1."""
    return dim if kind == "adagrad" else 1


def sparse_update(
    kind: str,
    weights: np.ndarray,
    state: np.ndarray | None,
    grads: np.ndarray,
    lr: float,
    eps: float = ADAGRAD_EPS,
) -> None:
    """The PS optimizers in numpy: in place, float32, the operation order of
    ``cpu_dist/sparse/csrc/optimizer.h`` (the one numpy oracle tests compare against).

    ``weights [u, d]`` and ``state`` (the optimizer state: ``[u]`` row-wise Adagrad's
    accumulators, ``[u, d]`` Adagrad's) are float32 arrays of the touched rows; ``grads [u, d]``
    their aggregated gradients.  ``eps`` is Adagrad's only (row-wise Adagrad's is 1e-8).
    """
    lr32 = np.float32(lr)
    g = np.asarray(grads, dtype=np.float32)
    if kind == "sgd":
        weights -= lr32 * g
        return
    if kind == "adagrad":
        assert state is not None and state.shape == g.shape, "adagrad's state is [u, d]"
        state += g * g
        weights -= lr32 * g / (np.sqrt(state) + np.float32(eps))
        return
    if kind != "rowwise_adagrad":
        raise ValueError(f"unknown sparse optimizer {kind!r}")
    assert state is not None
    sq = np.zeros(g.shape[0], dtype=np.float32)
    for c in range(g.shape[1]):  # columns in order, as the C++ loop sums them
        sq += g[:, c] * g[:, c]
    state += sq / np.float32(g.shape[1])
    step = lr32 / (np.sqrt(state) + np.float32(1e-8))
    weights -= step[:, None] * g
