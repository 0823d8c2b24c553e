#!/usr/bin/env python
"""Real-data throughput: parsing, conversion, reading and training on Criteo-format data, one run.

Generates a Criteo-format TSV file with its own generator (``cpu_dist.data.generate``: the
synthetic stream written out, so training on it moves as many keys as the stream; default 1M
lines, ``--lines``), then measures, in order:
  pyarrow_lines_per_s   the comparison: pyarrow.csv.read_csv of the whole file, default threads,
                        tab delimiter, no header, int64 for the 14 numeric columns and string for
                        the 26 hex columns, nothing after parsing
  tsv_lines_per_s       the TSV path (--data criteo): one process reading every line into
                        batches, as one worker of a one-worker job does (first pass included)
  convert_lines_per_s   python -m cpu_dist.data.convert on the same file, all cores
  bin_samples_per_s     batches read from the converted layout by one worker
  train_sps_*           2 workers + 1 PS shard on the converted layout, the synthetic stream
                        and the TSV file (default DLRM, batch 2048, --train-steps steps)
  data_share_*          t_data / (sum of all t_* phases) of those runs' summaries
The last line is one JSON object.  Targets: convert >= 0.7 x pyarrow, tsv >= 0.5 x pyarrow,
data shares <= 0.03, train_sps_bin >= train_sps_synthetic.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.csv as pcsv  # noqa: E402

from cpu_dist.data import CriteoBinary, CriteoTSV, WorkerBatches  # noqa: E402
from cpu_dist.data.convert import convert  # noqa: E402
from cpu_dist.data.generate import write_file  # noqa: E402
from cpu_dist.testing.jobs import measured_flags, run_job  # noqa: E402
from cpu_dist.train.metrics import read_summary  # noqa: E402

NAMES = ["label"] + [f"I{j}" for j in range(1, 14)] + [f"C{f}" for f in range(1, 27)]


def pyarrow_lines_per_s(path: Path) -> float:
    types = {n: pa.int64() for n in NAMES[:14]} | {n: pa.string() for n in NAMES[14:]}
    t0 = time.perf_counter()
    table = pcsv.read_csv(
        path,
        read_options=pcsv.ReadOptions(column_names=NAMES),
        parse_options=pcsv.ParseOptions(delimiter="\t"),
        convert_options=pcsv.ConvertOptions(column_types=types),
    )
    return table.num_rows / (time.perf_counter() - t0)


def tsv_lines_per_s(path: Path, batch_size: int) -> float:
    t0 = time.perf_counter()
    ds = CriteoTSV(path, eval_every=0)  # every line is a training line
    with WorkerBatches(ds, batch_size, 0, 0, 1) as batches:
        for _ in batches:
            pass
    return ds.num_lines / (time.perf_counter() - t0)


def convert_lines_per_s(path: Path, out: Path) -> float:
    t0 = time.perf_counter()
    m = convert([str(path)], out, progress=False, log=lambda *_: None)
    return m["lines"] / (time.perf_counter() - t0)


def bin_samples_per_s(out: Path, batch_size: int) -> float:
    t0 = time.perf_counter()
    ds = CriteoBinary(out, eval_every=0)
    n = 0
    with WorkerBatches(ds, batch_size, 0, 0, 1) as batches:
        for _, b in batches:
            n += len(b)
    return n / (time.perf_counter() - t0)


def train(args, name: str, data: list[str]) -> dict:
    metrics = Path(tempfile.mkdtemp()) / f"{name}.jsonl"
    flags = measured_flags(args.batch_size, args.train_steps, metrics)
    run_job(name, 3, ["--worker-num", "2", *flags, *data], timeout_s=1800)
    summary = read_summary(metrics)
    phases = {k: v for k, v in summary.items() if k.startswith("t_")}
    return {
        "samples_per_s": summary["samples_per_s"],
        "steps": summary["steps"],
        "data_share": phases.get("t_data", 0.0) / max(sum(phases.values()), 1e-9),
        "data_ms_per_step": 1e3 * phases.get("t_data", 0.0) / max(summary["steps"], 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--lines", type=int, default=1_000_000, help="lines of the generated file")
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--train-steps", type=int, default=60)
    p.add_argument("--dir", default=None, help="work folder (default: a temporary one)")
    args = p.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_data_"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "criteo.tsv"
    t0 = time.perf_counter()
    write_file(src, args.lines)
    print(
        f"generated {args.lines} lines, {src.stat().st_size / 1e6:.0f} MB in "
        f"{time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    res: dict[str, float] = {}
    res["pyarrow_lines_per_s"] = pyarrow_lines_per_s(src)
    print("pyarrow", round(res["pyarrow_lines_per_s"]), flush=True)
    res["tsv_lines_per_s"] = tsv_lines_per_s(src, args.batch_size)
    print("tsv", round(res["tsv_lines_per_s"]), flush=True)
    out = work / "bin"
    res["convert_lines_per_s"] = convert_lines_per_s(src, out)
    print("convert", round(res["convert_lines_per_s"]), flush=True)
    res["bin_samples_per_s"] = bin_samples_per_s(out, args.batch_size)
    print("bin", round(res["bin_samples_per_s"]), flush=True)
    runs = {
        "bin": ["--data", "criteo-bin", "--data-path", str(out)],
        "synthetic": [],
        "tsv": ["--data", "criteo", "--data-path", str(src)],
    }
    trained = {}
    for name, data in runs.items():
        trained[name] = train(args, name, data)
        print(name, json.dumps(trained[name]), flush=True)
    for name in runs:
        res[f"train_sps_{name}"] = trained[name]["samples_per_s"]
    res["data_share_bin"] = trained["bin"]["data_share"]
    res["data_share_synthetic"] = trained["synthetic"]["data_share"]
    line = {k: round(v, 4 if "share" in k else 1) for k, v in res.items()}
    line["convert_vs_pyarrow"] = round(res["convert_lines_per_s"] / res["pyarrow_lines_per_s"], 3)
    line["tsv_vs_pyarrow"] = round(res["tsv_lines_per_s"] / res["pyarrow_lines_per_s"], 3)
    line["bin_vs_synthetic"] = round(res["train_sps_bin"] / res["train_sps_synthetic"], 3)
    line["data_share_tsv"] = round(trained["tsv"]["data_share"], 4)
    line["lines"] = args.lines
    if not args.dir:
        for f in sorted(work.rglob("*"), reverse=True):
            f.unlink() if f.is_file() else f.rmdir()
        work.rmdir()
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
