"""A PS rank's failed RPC is renamed after the rank from the error's attributes (shard,
address, code), not by parsing its message, and keeps them."""

from __future__ import annotations

import socket
from typing import cast

from cpu_dist.common.mpi_context import Roles
from cpu_dist.sparse import Client, PSError
from cpu_dist.train.job import _name_shard_rank


class _Roles:
    worker_num = 2


def _dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_lost_ps_rank_is_named_by_its_world_rank_from_the_attributes():
    address = _dead_address()
    client = Client([address], "token", 8, timeout_s=2.0)
    try:
        client.health()
    except PSError as exc:
        err = exc
    else:
        raise AssertionError("health() of a dead address succeeded")
    finally:
        client.close()
    assert (err.shard, err.address, err.code) == (0, address, "UNAVAILABLE")
    renamed = _name_shard_rank(err, cast(Roles, _Roles()), external=False)
    assert str(renamed).startswith(f"PS shard 0 = world rank 2: shard 0 ({address}): UNAVAILABLE")
    assert (renamed.shard, renamed.address, renamed.code) == (0, address, "UNAVAILABLE")
    # external shards are not ranks of the job: the error stays as it is
    assert _name_shard_rank(err, cast(Roles, _Roles()), external=True) is err
    # a message that merely looks like one is not parsed
    plain = PSError("shard 1 (somewhere): made up")
    assert _name_shard_rank(plain, cast(Roles, _Roles()), external=False) is plain
