"""Other hosts on one machine, for tests and benchmarks: network namespaces joined to this one
by veth pairs, each namespace a host with its own address (and, where asked, its own host
name, through ``unshare --uts``), optionally behind a bandwidth limit (``tc ... tbf`` in both
directions; ``netem`` is not in every kernel).

Traffic goes only to these namespaces' addresses and loopback.  Everything a lab made is
removed when it closes, also after a failure (processes started in its hosts first), and a
lab removes the leftovers of labs whose process died before it could.  Needs root and
``ip netns``; :func:`unavailable` says why a machine cannot host a lab.

    with NetLab(hosts=2) as lab:
        shard = lab.popen(lab.hosts[0], [sys.executable, "-m", "cpu_dist.sparse.server", ...])
        ... workers here reach lab.hosts[0].address ...
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass

PREFIX = "cdlab"  # names of every namespace and link a lab makes start with this
_SUBNET_BASE = (10, 213)  # 10.213.K.0/24, one K per link


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """None when this machine can make network namespaces, else the reason it cannot."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add is not permitted here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    name: str  # the namespace
    address: str  # the host's address on its link
    peer: str  # this namespace's address on the same link
    subnet: str  # the link's subnet, e.g. for MPI's *_if_include settings
    outer: str  # the veth end in this namespace
    inner: str  # the veth end in the host's namespace


def _remove_stale() -> None:
    """Namespaces and links of labs whose process is gone (a crashed test run)."""
    listed = _ip("netns", "list", check=False).stdout.split()
    for name in listed:
        if not name.startswith(PREFIX) or "x" not in name:
            continue
        pid = name[len(PREFIX) :].split("x")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _ip("netns", "del", name, check=False)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        link = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        pid = link[3:].split("x")[0]
        if link.startswith("cdo") and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _ip("link", "del", link, check=False)


class NetLab:
    def __init__(self, hosts: int = 1) -> None:
        if not 1 <= hosts <= 8:
            raise ValueError("a lab has 1 to 8 hosts")
        self.count = hosts
        self.hosts: list[Host] = []
        self._procs: list[subprocess.Popen] = []

    # -- lifetime -------------------------------------------------------------------------
    def __enter__(self) -> NetLab:
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(f"no network lab on this machine: {reason}")
        _remove_stale()
        try:
            for i in range(self.count):
                self._make_host(i)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _free_subnet(self, i: int) -> int:
        used = _ip("-4", "-o", "addr", "show", check=False).stdout
        for k in range((os.getpid() * 8 + i * 37) % 250, 250 + (os.getpid() * 8 + i * 37) % 250):
            third = k % 250 + 1
            if f"{_SUBNET_BASE[0]}.{_SUBNET_BASE[1]}.{third}." not in used:
                return third
        raise RuntimeError("no free 10.213.K.0/24 subnet for a lab link")

    def _make_host(self, i: int) -> None:
        tag = f"{os.getpid()}x{i}"
        ns, outer, inner = f"{PREFIX}{tag}", f"cdo{tag}", f"cdi{tag}"
        third = self._free_subnet(i)
        net = f"{_SUBNET_BASE[0]}.{_SUBNET_BASE[1]}.{third}"
        host = Host(ns, f"{net}.2", f"{net}.1", f"{net}.0/24", outer, inner)
        self.hosts.append(host)  # from here on close() removes whatever of it exists
        _ip("netns", "add", ns)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", ns)
        _ip("addr", "add", f"{host.peer}/24", "dev", outer)
        _ip("link", "set", outer, "up")
        for args in (
            ("addr", "add", f"{host.address}/24", "dev", inner),
            ("link", "set", inner, "up"),
            ("link", "set", "lo", "up"),
        ):
            _ip("netns", "exec", ns, "ip", *args)

    def close(self) -> None:
        """Stop the processes started in the hosts, then remove every link and namespace."""
        for p in self._procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                p.wait(timeout=10)
        self._procs.clear()
        for h in self.hosts:
            pids = _ip("netns", "pids", h.name, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("link", "del", h.outer, check=False)  # takes its peer with it
            _ip("netns", "del", h.name, check=False)
        self.hosts.clear()

    # -- use ------------------------------------------------------------------------------
    def limit(self, host: Host, gbit: float, burst: str = "256kb", latency: str = "50ms") -> None:
        """Limit the link to ``host`` to ``gbit`` Gbit/s in both directions (tbf)."""
        spec = ["root", "tbf", "rate", f"{gbit}gbit", "burst", burst, "latency", latency]
        subprocess.run(["tc", "qdisc", "replace", "dev", host.outer, *spec], check=True, timeout=30)
        subprocess.run(
            ["ip", "netns", "exec", host.name, "tc", "qdisc", "replace", "dev", host.inner, *spec],
            check=True,
            timeout=30,
        )

    def command(self, host: Host, argv: list[str], hostname: str | None = None) -> list[str]:
        """``argv`` run inside ``host`` (with its own host name when one is given)."""
        prefix = ["ip", "netns", "exec", host.name]
        if hostname is not None:
            prefix += ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname]
        return [*prefix, *argv]

    def popen(
        self, host: Host, argv: list[str], hostname: str | None = None, **kw
    ) -> subprocess.Popen:
        """Start ``argv`` inside ``host``; the lab kills it (and its group) when it closes."""
        p = subprocess.Popen(self.command(host, argv, hostname), start_new_session=True, **kw)
        self._procs.append(p)
        return p


def mpi_env_for(subnets: list[str]) -> dict[str, str]:
    """MPI's own TCP traffic (OpenMPI's oob and btl, PMIx's listener) kept on these links, so
    one ``mpirun`` job can span the lab's hosts."""
    nets = ",".join(subnets)
    return {
        "OMPI_MCA_oob_tcp_if_include": nets,
        "OMPI_MCA_btl_tcp_if_include": nets,
        "PMIX_MCA_ptl_tcp_if_include": nets,
    }
