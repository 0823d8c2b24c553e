"""Which address a PS rank listens on and publishes, so that ranks on other hosts reach it.

``gethostbyname(gethostname())`` is not that address: Debian maps the host name to 127.0.1.1
in /etc/hosts.  So every rank describes its node (host name and the IPv4 addresses of its
interfaces); when every rank is on the same node the job stays on loopback, and otherwise a
PS rank publishes the local address its kernel would use to reach another rank's node (a
UDP ``connect`` picks the route and sends nothing).  ``--ps-host`` and ``--ps-interface``
override the choice.  Ranks in different network namespaces of one machine share a host name
but not their interfaces, so they count as different nodes, as they must.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class NodeInfo:
    hostname: str
    addresses: tuple[str, ...]  # non-loopback IPv4 addresses of the node's interfaces


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def interface_addresses() -> dict[str, str]:
    """``{interface name: IPv4 address}`` of every interface that has one."""
    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                req = struct.pack("256s", name.encode()[:15])
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)
            except OSError:  # no IPv4 address on this interface
                continue
            out[name] = socket.inet_ntoa(packed[20:24])
    return out


def this_node() -> NodeInfo:
    addrs = sorted({a for a in interface_addresses().values() if not is_loopback(a)})
    return NodeInfo(socket.gethostname(), tuple(addrs))


def route_source(peer: str) -> str | None:
    """The local address the kernel would send from to reach ``peer``; None without a route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((peer, 9))  # UDP: chooses the route, sends nothing
            return str(s.getsockname()[0])
    except OSError:
        return None


def _resolve(hostname: str) -> str | None:
    try:
        return socket.gethostbyname(hostname)
    except OSError:
        return None


def choose_publish_address(
    own: NodeInfo,
    peers: Sequence[NodeInfo],
    route: Callable[[str], str | None] = route_source,
    resolve: Callable[[str], str | None] = _resolve,
) -> str:
    """An address of ``own`` that the other nodes in ``peers`` can reach."""
    for peer in peers:
        if peer == own:
            continue
        for address in peer.addresses:
            source = route(address)
            if source is not None and not is_loopback(source) and source in own.addresses:
                return source
    resolved = resolve(own.hostname)
    if resolved is not None and not is_loopback(resolved):
        return resolved
    if own.addresses:
        return own.addresses[0]
    raise RuntimeError(
        f"host {own.hostname} has no address other hosts can reach (its name resolves to "
        f"{resolved}, and it has no non-loopback interface address); pass --ps-host ADDR or "
        "--ps-interface NAME"
    )


def interface_address(name: str) -> str:
    """The IPv4 address of interface ``name`` (``--ps-interface``)."""
    addrs = interface_addresses()
    if name not in addrs:
        have = ", ".join(f"{k} ({v})" for k, v in sorted(addrs.items())) or "none"
        raise RuntimeError(
            f"--ps-interface {name}: no such interface with an IPv4 address (this host has: {have})"
        )
    return addrs[name]
