"""A real job inside a pytest-mpi test: the last rank(s) serve a PS shard, the rest are workers."""

from __future__ import annotations

from mpi4py import MPI

from cpu_dist.common.mpi_context import (
    Roles,
    exchange_ps_addresses,
    share_job_secret,
    split_roles,
    wait_all,
)
from cpu_dist.sparse import Client, Server


def start_job(dim: int, seed: int, scale: float) -> tuple[Roles, str, int, list[str]]:
    """Split roles (two PS ranks with 4+ ranks, else one) and publish the shards' addresses.

    PS ranks serve here until worker 0 calls ``end_job`` and return ``None``; workers get
    ``(roles, token, session, addresses)``."""
    world = MPI.COMM_WORLD
    workers = world.Get_size() - (2 if world.Get_size() >= 4 else 1)
    roles = split_roles(workers, world)
    token, session = share_job_secret(roles)
    if roles.is_worker:
        return roles, token, session, exchange_ps_addresses(roles, None, None, 60)
    server = Server(
        dim,
        token,
        init_scale=scale,
        seed=seed,
        shard_index=roles.role_rank,
        num_shards=roles.num_ps_ranks,
    )
    exchange_ps_addresses(roles, f"127.0.0.1:{server.start()}", None, 60)
    while not server.wait(0.5):
        pass
    wait_all(roles.world, 60, "test end")
    return None


def end_job(roles: Roles, client: Client) -> None:
    wait_all(roles.comm, 60, "workers done")
    if roles.role_rank == 0:
        client.shutdown()
    wait_all(roles.world, 60, "test end")
