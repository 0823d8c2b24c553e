"""Criteo data as Parquet files (``python -m cpu_dist.data.to_parquet``): the layout
``--data parquet`` reads, and what NVTabular writes from Criteo.

Columns: ``label`` (int8, 0/1), ``int_0`` ... ``int_12`` (float32, the readers' transformed
values: ``log(1 + max(x, 0))``), ``cat_0`` ... ``cat_25`` (int64, each feature's own ids: the
raw values folded by the hashing flags, as the Criteo readers fold them).  With
``--multi-hot-sizes`` a feature of size > 1 is a ``list<int64>`` column holding the bags
``--data criteo --multi-hot-sizes`` would draw (same ``--seed``): MLPerf's multi-hot Criteo,
materialised.  So a job on the output trains on the same rows, in the same order, as on the
input (``test_parquet_job``): the splits agree too, as long as the TSV had no skipped lines
(the one-file rule counts physical lines; the converter warns otherwise).

One input file: ``--output FILE.parquet``; a converted directory of several inputs (the
Terabyte days): ``--output DIR``, one file per input, named so that they sort in day order.

Example::

    python -m cpu_dist.data.to_parquet --data criteo --data-path day_0.tsv \\
        --multi-hot-sizes mlperf --output day_0.parquet
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from cpu_dist.common.data_flags import add_data_flags
from cpu_dist.common.features import categorical_names, dense_names
from cpu_dist.data.file_dataset import FileDataset
from cpu_dist.data.keys import CRITEO_VALUE_MASK, fuse_criteo_columns

ROW_GROUP_ROWS = 1 << 16


def table_of(dataset: FileDataset, rows: np.ndarray) -> pa.Table:
    """Rows ``rows`` of a Criteo dataset as a Parquet table (see the module docstring)."""
    parsed = dataset.read_rows(rows)
    ids = fuse_criteo_columns(parsed.cats, dataset.hash_sizes) & CRITEO_VALUE_MASK
    columns: dict[str, pa.Array] = {"label": pa.array(parsed.labels.astype(np.int8))}
    dense = np.ascontiguousarray(parsed.dense, dtype=np.float32)
    for j, name in enumerate(dense_names(dense.shape[1])):
        columns[name] = pa.array(dense[:, j])
    bags = dataset.multi_hot.bags(ids) if dataset.multi_hot is not None else {}
    for f, name in enumerate(categorical_names(ids.shape[1])):
        bag = bags.get(name)
        if bag is None:
            columns[name] = pa.array(ids[:, f])
        else:
            columns[name] = pa.ListArray.from_arrays(
                pa.array(bag.offsets.astype(np.int32)), pa.array(bag.values)
            )
    return pa.table(columns)


def write(dataset: FileDataset, rows: range, out: Path, row_group_rows: int) -> int:
    """Rows ``rows`` (in file order) into ``out``, one row group per ``row_group_rows``."""
    writer = None
    try:
        for lo in range(rows.start, rows.stop, row_group_rows):
            hi = min(lo + row_group_rows, rows.stop)
            table = table_of(dataset, np.arange(lo, hi, dtype=np.int64))
            if writer is None:
                writer = pq.ParquetWriter(out.with_suffix(".tmp"), table.schema)
            writer.write_table(table, row_group_size=row_group_rows)
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        raise SystemExit(f"to_parquet: the input has no rows: nothing written to {out}")
    out.with_suffix(".tmp").replace(out)
    return len(rows)


def main(argv: Sequence[str] | None = None) -> int:
    from cpu_dist.common.config_errors import ConfigError
    from cpu_dist.common.validate_data import data_config
    from cpu_dist.data.factory import dataset_for

    p = argparse.ArgumentParser(
        prog="python -m cpu_dist.data.to_parquet", description=__doc__.split("\n\n")[0]
    )
    add_data_flags(p)
    p.add_argument("--seed", type=int, default=0, help="the multi-hot draws' seed (--seed)")
    p.add_argument("--output", required=True, help="FILE.parquet (one input) or DIR (several)")
    p.add_argument("--row-group-rows", type=int, default=ROW_GROUP_ROWS)
    a = p.parse_args(argv)
    if a.data not in ("criteo", "criteo-bin"):
        p.error(f"--data {a.data}: converts Criteo data (--data criteo or criteo-bin)")
    if a.row_group_rows <= 0:
        p.error("--row-group-rows must be positive")
    try:
        data = data_config(a)
    except ConfigError as exc:
        p.error(str(exc))
    dataset = dataset_for(data, a.seed)
    assert isinstance(dataset, FileDataset)
    bad_lines = int(getattr(dataset, "bad_lines", 0))
    if bad_lines:
        print(
            f"to_parquet: warning: the input skipped {bad_lines} bad lines: the "
            "every-10th-row split of the output differs from the input's",
            file=sys.stderr,
        )
    starts = getattr(dataset, "_starts", None)
    rows = int(getattr(dataset, "num_rows"))  # noqa: B009 (both Criteo readers have it)
    bounds = [0, rows] if starts is None else [int(s) for s in starts]
    out = Path(a.output)
    if len(bounds) == 2:
        if out.is_dir():
            p.error(f"--output {out}: is a directory; one input makes one file")
        targets = [out]
    else:
        out.mkdir(parents=True, exist_ok=True)
        names = getattr(dataset, "inputs", None) or [str(i) for i in range(len(bounds) - 1)]
        targets = [out / f"{i:03d}_{Path(n).stem}.parquet" for i, n in enumerate(names)]
    total = 0
    for target, lo, hi in zip(targets, bounds, bounds[1:]):
        total += write(dataset, range(lo, hi), target, a.row_group_rows)
        print(f"to_parquet: {target}: {hi - lo} rows", flush=True)
    print(f"to_parquet: {total} rows in {len(targets)} file(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
