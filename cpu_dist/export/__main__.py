"""``python -m cpu_dist.export CHECKPOINT_DIR --output DIR``: a serving bundle from a
checkpoint (a checkpoint root: its newest complete checkpoint; or one step directory)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from cpu_dist.checkpoint.manifest import CheckpointError
from cpu_dist.common.process_exit import skip_exit_collection
from cpu_dist.export import export_checkpoint
from cpu_dist.serving.bundle import BundleError
from cpu_dist.sparse import PSError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cpu_dist.export", description=__doc__)
    ap.add_argument("checkpoint", help="checkpoint root or step directory")
    ap.add_argument("--output", required=True, help="directory of the bundle")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds for the load")
    ap.add_argument(
        "--shard-dir",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="a standalone shard's --checkpoint-dir (or a copy of it): where the files that "
        "shards started with python -m cpu_dist.sparse.server wrote are; repeat for several",
    )
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        rows = export_checkpoint(
            Path(args.checkpoint), Path(args.output), args.timeout, args.shard_dir
        )
    except (CheckpointError, BundleError, PSError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"exported {rows} rows to {args.output} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    code = main()
    skip_exit_collection()
    sys.exit(code)
