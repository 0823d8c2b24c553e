"""Python gRPC stubs generated from ``proto/ps.proto`` on demand (grpcio-tools).

The project's own client is C++; these stubs are for what must speak the wire contract
independently of it: tests that send requests our client refuses to build, the fuzz test,
and tools.  Generated at run time so they can never drift from the proto.

The job token travels as call metadata (:data:`TOKEN_METADATA_KEY`), never in a message:
pass ``metadata=token_metadata(token)`` to a call, or make the channel with
:func:`token_channel` so that every call carries it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

PROTO = Path(__file__).resolve().parents[2] / "proto" / "ps.proto"
# The metadata key of the job token (csrc/token.h holds the C++ definition).
TOKEN_METADATA_KEY = "x-cpu-dist-token"


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


def token_metadata(token: str) -> list[tuple[str, str]]:
    """The call metadata that carries ``token`` (empty for an empty token: no token at all)."""
    return [(TOKEN_METADATA_KEY, token)] if token else []


def token_channel(
    address: str, token: str, options: Sequence[tuple[str, Any]] | None = None
) -> Any:
    """An insecure grpcio channel to ``address`` whose every unary call carries ``token``
    (added to the call's own metadata; none for an empty token)."""
    import grpc

    class AddToken(grpc.UnaryUnaryClientInterceptor):
        def intercept_unary_unary(self, continuation, details, request):
            metadata = [*(details.metadata or []), *token_metadata(token)]
            return continuation(details._replace(metadata=metadata), request)

    channel = grpc.insecure_channel(address, options=list(options or []))
    return grpc.intercept_channel(channel, AddToken())
