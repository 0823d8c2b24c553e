"""Fixtures for the parameter-server tests: real in-process servers, and raw grpcio stubs
(generated from proto/ps.proto at test time) to send requests our client refuses to build."""

from __future__ import annotations

import time

import numpy as np
import pytest

from cpu_dist.sparse import Client, Server
from cpu_dist.sparse.grpc_stubs import generate

TOKEN = "test-token"


class Cluster:
    """num_shards in-process servers plus helpers to make clients for them."""

    def __init__(
        self, num_shards: int, dim: int, init_scale: float = 0.1, seed: int = 7, **server_kw
    ):
        self.dim = dim
        self.seed = seed
        self.init_scale = init_scale
        self.servers = [
            Server(
                dim,
                TOKEN,
                init_scale=init_scale,
                seed=seed,
                shard_index=i,
                num_shards=num_shards,
                **server_kw,
            )
            for i in range(num_shards)
        ]
        for s in self.servers:
            s.start()
        self.addresses = [s.address for s in self.servers]

    def client(self, **kw) -> Client:
        kw.setdefault("timeout_s", 20.0)
        return Client(self.addresses, TOKEN, self.dim, **kw)

    def rows(self) -> int:
        return sum(s.stats()["rows"] for s in self.servers)

    def stop(self):
        for s in self.servers:
            s.stop(2.0)


@pytest.fixture
def cluster_factory():
    made: list[Cluster] = []

    def make(num_shards: int = 1, dim: int = 8, **kw) -> Cluster:
        c = Cluster(num_shards, dim, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


@pytest.fixture(scope="session")
def pb(tmp_path_factory):
    """(ps_pb2, ps_pb2_grpc) generated from proto/ps.proto into a temp dir."""
    return generate(tmp_path_factory.mktemp("ps_proto"))


def rng_grads(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    return rng.standard_normal((n, dim)).astype(np.float32)


def wait_until(predicate, timeout_s: float = 20.0, what: str = "") -> None:
    """Polls ``predicate`` until it holds (a shard's state seen through its stats)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.01)  # a poll interval, not a synchronisation
