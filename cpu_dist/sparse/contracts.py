"""Python twins of the C++ hash contracts in ``csrc/hashing.h``.

The single-process reference model must start from exactly the rows the parameter server
creates on first touch, and tools must know which shard owns a key without asking one.
Both functions here are tested bit for bit against the native module.
"""

from __future__ import annotations

import numpy as np

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


def row_init(seed: int, keys, dim: int, scale: float) -> np.ndarray:
    """First-touch rows ``[len(keys), dim]`` float32, equal to the PS's bit for bit."""
    k = _as_u64(keys).reshape(-1, 1)
    base = mix64(mix64(np.array([seed], dtype=np.uint64)) ^ k)
    cols = np.arange(dim, dtype=np.uint64).reshape(1, -1)
    bits = mix64(base ^ cols)
    u = (bits >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)
    return (u * np.float32(2.0) - np.float32(1.0)) * np.float32(scale)


def partition_of(keys) -> np.ndarray:
    return (mix64(_as_u64(keys) ^ PARTITION_SALT) % np.uint64(NUM_PARTITIONS)).astype(np.int64)


def shard_of(keys, num_shards: int) -> np.ndarray:
    return partition_of(keys) % num_shards
