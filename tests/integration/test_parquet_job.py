"""Parquet input and Criteo made multi-hot under real jobs (mpirun, PS shards, gRPC):

- a Parquet file in NVTabular's layout (64-bit and negative ids, bags of any length, weights,
  several row groups) trains equal to ``python -m cpu_dist.reference``, the same bits at any
  shard count;
- Criteo with ``--multi-hot-sizes mlperf`` trains equal to the reference, and its Parquet
  conversion (``python -m cpu_dist.data.to_parquet``) gives the same bits;
- a file that breaks in a row group the job reaches ends the job with a non-zero exit code and
  a message naming the file, the column and the row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cpu_dist.testing.parquet_files import DATA, TABLES, write_parquet

from .job_files import three_tables
from .launch import ROOT, assert_dumps_close, cli_reference, mpirun, run_module, train

pytestmark = pytest.mark.timeout(900)

SAMPLE = ROOT / "cpu_dist/data/tests/data/criteo_sample.tsv"
FLAGS = ["--batch-size", "24", "--max_step", "12", "--lr", "0.02", "--sparse-lr", "0.02"]


def job(tmp_path, text: str, *extra: str) -> list[str]:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return ["--config", str(path), *FLAGS, *extra]


def test_a_parquet_job_equals_the_reference_at_any_shard_count(tmp_path):
    data = write_parquet(tmp_path / "day.parquet")
    args = job(tmp_path, TABLES + DATA, "--data-path", str(data))
    want = cli_reference(args, tmp_path / "reference.npz")
    got = train(tmp_path, "p2", 2, 2, args)
    assert_dumps_close(got, want, 1e-5, "parquet W=2 P=2")
    one = train(tmp_path, "p1", 2, 1, args)
    for k in got:
        np.testing.assert_array_equal(got[k], one[k], err_msg=f"P=1 vs P=2: {k}")
    keys = got["table/users/keys"]
    assert (keys < 0).any() and (np.abs(keys) >= 2**32).any()  # the 64 bits reached the PS
    assert got["table/items/keys"].max() < 1000 and got["table/items/keys"].min() >= 0


def test_multi_hot_criteo_equals_the_reference_and_its_parquet_conversion(tmp_path):
    # Adagrad's eps 1e-6, as the other equivalence tests: at the default 1e-8 a row whose
    # gradient cancels to ~eps turns the two workers' summation order (1e-12) into 1e-6
    # of an update, which no optimizer equivalence can hold at rtol 1e-5.
    tables = three_tables(
        narrow={"num_embeddings": 5000}, mid={"num_embeddings": 300}, wide={"eps": 1e-6}
    )
    converted = tmp_path / "sample.parquet"
    done = run_module(
        "cpu_dist.data.to_parquet", "--data", "criteo", "--data-path", str(SAMPLE),
        "--multi-hot-sizes", "mlperf", "--output", str(converted), "--row-group-rows", "64",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert pq.read_schema(converted).field("cat_20").type == pa.list_(pa.int64())
    criteo = job(
        tmp_path, tables, "--data", "criteo", "--data-path", str(SAMPLE),
        "--multi-hot-sizes", "mlperf",
    )  # fmt: skip
    want = cli_reference(criteo, tmp_path / "reference.npz")
    got = train(tmp_path, "criteo", 2, 2, criteo)
    assert_dumps_close(got, want, 1e-5, "multi-hot Criteo W=2 P=2")
    parquet = job(tmp_path, tables, "--data", "parquet", "--data-path", str(converted))
    same = train(tmp_path, "parquet", 2, 2, parquet)
    assert set(same) == set(got)
    for k in got:
        np.testing.assert_array_equal(same[k], got[k], err_msg=f"Parquet vs Criteo: {k}")
    # the bags are in effect: the one-hot job ends elsewhere
    one_hot = cli_reference(
        job(tmp_path, tables, "--data", "criteo", "--data-path", str(SAMPLE)),
        tmp_path / "one_hot.npz",
    )
    assert one_hot["table/wide/keys"].size < want["table/wide/keys"].size


def test_a_bad_row_group_ends_the_job_naming_the_file_column_and_row(tmp_path):
    data = write_parquet(tmp_path / "day.parquet")
    table = pq.read_table(data)
    w = table.column("tag_w").to_pylist()
    w[437] = w[437] + [1.0]  # one weight too many in row 437 (row group 8 of 50 rows)
    table = table.set_column(table.schema.get_field_index("tag_w"), "tag_w", pa.array(w))
    pq.write_table(table, data, row_group_size=50)
    args = job(tmp_path, TABLES + DATA, "--data-path", str(data), "--max_step", "30")
    proc = mpirun(3, ["--worker-num", "2", *args, "--no-progress"], timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert f"{data}: column 'tag_w': row 437:" in out and "weights for" in out, out[-3000:]
