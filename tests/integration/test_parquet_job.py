"""Parquet input and Criteo made multi-hot under real jobs (mpirun, PS shards, gRPC):

- a Parquet file in NVTabular's layout (64-bit and negative ids, bags of any length, weights,
  several row groups) trains equal to ``python -m cpu_dist.reference``, the same bits at any
  shard count;
- Criteo with ``--multi-hot-sizes mlperf`` trains equal to the reference, and its Parquet
  conversion (``python -m cpu_dist.data.to_parquet``) gives the same bits;
- bad data ends the job with exit 2 and one line naming the file, the column and the row:
  a later file's float id column before training, a row group the job reaches mid-run with
  its checkpoints left valid."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cpu_dist.checkpoint.manifest import check_files, find_latest
from cpu_dist.testing.parquet_files import DATA, TABLES, write_parquet

from .job_files import three_tables
from .launch import (
    ROOT,
    assert_dumps_close,
    assert_dumps_equal,
    cli_reference,
    mpirun,
    run_module,
    train,
)

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
    assert_dumps_equal(got, one, "P=2 vs P=1")
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
    assert_dumps_equal(same, got, "Parquet vs Criteo")
    # the bags are in effect: the one-hot job ends elsewhere
    one_hot = cli_reference(
        job(tmp_path, tables, "--data", "criteo", "--data-path", str(SAMPLE)),
        tmp_path / "one_hot.npz",
    )
    assert one_hot["table/wide/keys"].size < want["table/wide/keys"].size


def test_bad_data_ends_the_job_with_exit_2_and_one_line_naming_the_file_column_and_row(tmp_path):
    """A label found bad only when its row group is decoded mid-run ends the job with exit 2
    and a line naming the file, the column and the row (from each worker that read it), no
    traceback; the checkpoints written before it stay valid.  (A file whose footer is bad is
    refused by validate, before any rank starts: cpu_dist/data/tests/test_parquet.py.)"""
    data = write_parquet(tmp_path / "day.parquet")
    table = pq.read_table(data)
    labels = table.column("label").to_pylist()
    labels[437] = 2  # row 437 (row group 8 of 50 rows): found only when decoded, at step ~16
    i = table.schema.get_field_index("label")
    table = table.set_column(i, "label", pa.array(labels, pa.int64()))
    pq.write_table(table, data, row_group_size=50)
    ckpt = tmp_path / "ckpt"
    args = job(tmp_path, TABLES + DATA, "--data-path", str(data), "--max_step", "30")
    extra = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "4", "--no-progress"]
    proc = mpirun(3, ["--worker-num", "2", *args, *extra], timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [x for x in proc.stderr.splitlines() if x.startswith("launcher.py: error:")]
    assert errors, proc.stderr[-3000:]
    for x in errors:
        assert x.endswith(
            f"ParquetError: {data}: column 'label': row 437: label 2, expected 0 or 1"
        )
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    latest = find_latest(ckpt)
    assert latest is not None and latest.step >= 7, proc.stdout[-2000:]
    check_files(latest)  # every file present, of its size; the dense file's checksum
