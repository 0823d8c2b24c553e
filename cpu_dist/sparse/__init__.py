"""Sparse parameters: the C++ parameter server (gRPC) and its client.

Thin re-exports of the native modules: ``cpu_dist.sparse._ps_client`` (the client: gRPC and
protobuf only) and ``cpu_dist.sparse._ps`` (the shard, with RocksDB and ISA-L; it re-exports
the client's names too); see ``_ps.pyi`` for the API.  The shard's names are loaded on first
use, so a process that only talks to shards (a worker) never loads the shard's libraries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._ps_client import (
    Client,
    DumpPages,
    Handle,
    PSError,
    TablesHandle,
    client_defaults,
)

if TYPE_CHECKING:
    from ._ps import NUM_PARTITIONS, Server, partition_of, row_init

_SHARD_NAMES = ("NUM_PARTITIONS", "Server", "partition_of", "row_init")


def __getattr__(name: str) -> Any:
    """The shard's names, from ``_ps`` on first use (PEP 562)."""
    if name in _SHARD_NAMES:
        from . import _ps

        return getattr(_ps, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "NUM_PARTITIONS",
    "Client",
    "DumpPages",
    "Handle",
    "PSError",
    "Server",
    "TablesHandle",
    "client_defaults",
    "partition_of",
    "row_init",
]
