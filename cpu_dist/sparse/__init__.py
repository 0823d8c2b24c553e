"""Sparse parameters: the C++ parameter server (gRPC) and its client.

A thin re-export of the native module ``cpu_dist.sparse._ps``; see ``_ps.pyi`` for the API.
"""

from __future__ import annotations

from ._ps import (
    NUM_PARTITIONS,
    Client,
    DumpPages,
    Handle,
    PSError,
    Server,
    TablesHandle,
    client_defaults,
    partition_of,
    row_init,
)

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
