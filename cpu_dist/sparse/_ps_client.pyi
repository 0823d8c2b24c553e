"""Type stubs for cpu_dist.sparse._ps_client: the client half of the native code, its own
extension (no RocksDB, no ISA-L).  The API is declared once, in _ps.pyi (which re-exports
these names at run time too)."""

from ._ps import Client as Client
from ._ps import ClientDefaults as ClientDefaults
from ._ps import DumpPages as DumpPages
from ._ps import Handle as Handle
from ._ps import PSError as PSError
from ._ps import TablesHandle as TablesHandle
from ._ps import Traffic as Traffic
from ._ps import client_defaults as client_defaults
from ._ps import decode_rows as decode_rows
from ._ps import encode_rows as encode_rows
from ._ps import fill_rows as fill_rows
from ._ps import interleave_rows as interleave_rows
from ._ps import mark_written as mark_written
