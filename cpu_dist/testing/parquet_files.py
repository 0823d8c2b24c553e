"""Parquet files the tests and benchmarks write: NVTabular's layout (one column per feature),
a real pipeline hands over: 64-bit and negative ids, bags of any length (empty ones too),
per-id weights, several row groups."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

# Tables over the file's features: "users" keeps the raw 64-bit ids (no num_embeddings),
# "items" folds its two features' ids (as unsigned) into 1000 rows.
TABLES = """
[[tables]]
name = "users"
dim = 8
features = ["user"]
optimizer = "rowwise_adagrad"

[[tables]]
name = "items"
dim = 4
features = ["items", "tags"]
num_embeddings = 1000
optimizer = "sgd"
pooling = "mean"
"""
DATA = """
[data]
kind = "parquet"
dense = ["x0", "x1", "x2"]
weights = { tags = "tag_w" }
"""


def bag_column(rng: np.random.Generator, n: int, high: int, lo: int, hi: int):
    lengths = rng.integers(lo, hi + 1, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(-high, high, int(offsets[-1]), dtype=np.int64)
    return offsets, values


def write_parquet(path: Path, rows: int = 600, seed: int = 0, row_group: int = 50) -> Path:
    """A file of ``rows`` samples: label, x0..x2, user (int64), items and tags
    (list<int64>), tag_w (list<float>, as long as tags)."""
    rng = np.random.default_rng(seed)
    user = rng.integers(-(2**62), 2**62, rows, dtype=np.int64)
    user[::7] = user[3]  # repeats, so rows are trained more than once
    items_off, items = bag_column(rng, rows, 5000, 0, 6)
    tags_off, tags = bag_column(rng, rows, 2**40, 1, 3)
    table = pa.table(
        {
            "label": pa.array(rng.integers(0, 2, rows).astype(np.int64)),
            "x0": pa.array(rng.standard_normal(rows).astype(np.float32)),
            "x1": pa.array(rng.standard_normal(rows).astype(np.float32)),
            "x2": pa.array(rng.random(rows).astype(np.float64)),
            "user": pa.array(user),
            "items": pa.ListArray.from_arrays(pa.array(items_off), pa.array(items)),
            "tags": pa.ListArray.from_arrays(pa.array(tags_off), pa.array(tags)),
            "tag_w": pa.ListArray.from_arrays(
                pa.array(tags_off), pa.array(rng.random(len(tags)).astype(np.float32))
            ),
        }
    )
    pq.write_table(table, path, row_group_size=row_group)
    return path
