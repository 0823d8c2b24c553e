"""Python gRPC stubs generated from ``proto/ps.proto`` on demand (grpcio-tools).

The project's own client is C++; these stubs are for what must speak the wire contract
independently of it: tests that send requests our client refuses to build, the fuzz test,
and tools.  Generated at run time so they can never drift from the proto.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

PROTO = Path(__file__).resolve().parents[2] / "proto" / "ps.proto"


def generate(out_dir: str | Path) -> tuple[ModuleType, ModuleType]:
    """Write ps_pb2.py and ps_pb2_grpc.py into ``out_dir`` and import them."""
    from grpc_tools import protoc

    out = Path(out_dir)
    rc = protoc.main(
        [
            "protoc",
            f"-I{PROTO.parent}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            str(PROTO),
        ]
    )
    if rc != 0:
        raise RuntimeError(f"protoc failed on {PROTO} (exit {rc})")
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module("ps_pb2"), importlib.import_module("ps_pb2_grpc")
    finally:
        sys.path.remove(str(out))
