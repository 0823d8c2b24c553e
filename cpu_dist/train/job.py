"""One rank's part of a job, after flags are checked and roles are split."""

from __future__ import annotations

import argparse
import os
import re
import sys

from cpu_dist.common.config import parse_ps_list
from cpu_dist.common.mpi_context import (
    Roles,
    exchange_ps_addresses,
    ps_listen_host,
    share_job_secret,
    wait_all,
)
from cpu_dist.common.threads import share_cores, workers_on_this_node
from cpu_dist.sparse import PSError

END_OF_JOB_TIMEOUT_S = 600.0


def _external_token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as f:
            token = f.read().strip()
        if not token:
            raise RuntimeError(f"--token-file {args.token_file} is empty")
        return token
    return os.environ.get("CPU_DIST_TOKEN")


def _name_shard_rank(message: str, roles: Roles, external: bool) -> str:
    """Adds the world rank of the shard a failed RPC names ("shard I (ADDR): ..."), so that
    a lost PS rank is named the way mpirun names ranks."""
    m = re.match(r"shard (\d+) ", message)
    if m is None or external:
        return message
    shard = int(m.group(1))
    return f"PS shard {shard} = world rank {roles.worker_num + shard}: {message}"


def run_job(args: argparse.Namespace, roles: Roles) -> int:
    ps_list = parse_ps_list(args.ps_list) if args.ps_list else []
    external = bool(ps_list) and roles.num_ps_ranks == 0
    token, session = share_job_secret(roles, _external_token(args) if external else None)
    job_host = ps_listen_host(roles, args.ps_host)
    if args.ps_type.lower() == "rdma":
        if job_host != "127.0.0.1" and roles.rank == 0:
            raise RuntimeError(
                "--ps-type RDMA: no RDMA transport exists yet; on one node it "
                "selects the local gRPC backend, across nodes use --ps-type grpc"
            )
        if roles.rank == 0:
            print(
                "cpu_dist: --ps-type RDMA on a single node: using the local gRPC backend",
                file=sys.stderr,
                flush=True,
            )

    local_workers = workers_on_this_node(roles.world, roles.is_worker)
    if roles.is_worker:
        from cpu_dist.train.loop import train_worker

        share_cores(local_workers)
        addresses = ps_list if external else exchange_ps_addresses(roles, None, None)
        try:
            train_worker(args, roles, token, session, addresses, stop_shards=not external)
        except PSError as exc:
            raise PSError(_name_shard_rank(str(exc), roles, external)) from exc
    else:
        from cpu_dist.train.ps_rank import run_ps_rank

        run_ps_rank(args, roles, token, job_host, ps_list)
    wait_all(roles.world, END_OF_JOB_TIMEOUT_S, "end of job")
    return 0
