"""The data flags: the launcher's, and those of every tool that reads the same batches."""

from __future__ import annotations

import argparse

from cpu_dist.common.config import DATA_KINDS, MULTI_HOT_DISTRIBUTIONS, DataConfig


def add_data_flags(p: argparse.ArgumentParser) -> None:
    """The data flags: the launcher's, and those of every tool that reads the same batches
    (``python -m cpu_dist.serving``)."""
    d = p.add_argument_group("data")
    d.add_argument("--data", default=DataConfig.kind, choices=list(DATA_KINDS))
    d.add_argument(
        "--data-path",
        default=None,
        help="Criteo TSV file (--data criteo), directory made by python -m "
        "cpu_dist.data.convert (--data criteo-bin), or a Parquet file or directory of them "
        "(--data parquet)",
    )
    d.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="count and skip malformed Criteo lines instead of failing (--data criteo; "
        "the converter has its own)",
    )
    d.add_argument("--zipf-exponent", type=float, default=DataConfig.zipf_exponent)
    d.add_argument(
        "--num-embeddings-per-feature",
        default=None,
        metavar="N1,...,N26",
        help="Criteo: hash feature f's values into N_f rows (value %% N_f); default 2**32",
    )
    d.add_argument(
        "--max-ind-range",
        type=int,
        default=None,
        metavar="N",
        help="Criteo: hash every feature's values into at most N rows",
    )
    d.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="Criteo: passes over the training data (default 1, or as many as --max_step "
        "takes when it is given); with both, training stops at whichever comes first",
    )
    d.add_argument(
        "--shuffle",
        action="store_true",
        help="Criteo: shuffle the batch order of each epoch (deterministic from --seed)",
    )
    d.add_argument(
        "--multi-hot-sizes",
        default=None,
        metavar="S1,...,S26|mlperf",
        help="Criteo: make feature f multi-hot, each id a bag of S_f ids (the id and S_f - 1 "
        "drawn from (--seed, f, id)); 'mlperf': MLPerf DLRM-DCNv2's sizes (214 ids a sample)",
    )
    d.add_argument(
        "--multi-hot-distribution",
        default=DataConfig.multi_hot_distribution,
        choices=list(MULTI_HOT_DISTRIBUTIONS),
        help="how --multi-hot-sizes draws the extra ids (MLPerf's: uniform over the feature's ids)",
    )
