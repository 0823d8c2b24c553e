"""Criteo-format TSV files made from the synthetic stream, for tests, demos and benchmarks.

The real logs cannot ship with the project; these files have their layout (label, 13 integer
fields with missing and negative values, 26 eight-digit hex fields with missing values) and,
because they are the synthetic stream written out, its key statistics (Zipf-distributed ids,
learnable labels), so training on a generated file costs what training on the stream costs
in sparse traffic.  Each categorical id becomes a 32-bit value through a bijection per feature
(odd multiplier), so distinct ids stay distinct and values look like Criteo's hashes.

``python -m cpu_dist.data.generate OUT --lines N [--days D] [--gzip]`` writes one file, or D day
files ``day_0`` ... into the folder OUT.
"""

from __future__ import annotations

import argparse
import gzip
import os
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.csv as pcsv  # type: ignore[import-untyped]

from cpu_dist.data.synthetic import SyntheticCriteo
from cpu_dist.data.tsv_parse import NUM_DENSE, NUM_SPARSE

_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
_SHIFTS = np.arange(28, -1, -4, dtype=np.uint64)  # first character: the highest nibble
_CHUNK = 1 << 15


def _hex8(values: np.ndarray) -> pa.Array:
    """uint32 values -> 8-digit lowercase hex strings."""
    nibbles = (values.astype(np.uint64)[:, None] >> _SHIFTS[None, :]) & np.uint64(15)
    text = _HEX[nibbles.astype(np.intp)]
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(8), len(values), [None, pa.py_buffer(text.tobytes())]
    )
    return fixed.cast(pa.binary()).cast(pa.string())


def _table(ds: SyntheticCriteo, step: int, rows: int, missing: float, seed: int) -> pa.Table:
    batch = ds.global_batch(step, rows)
    rng = np.random.default_rng([seed, 0x67656E, step])  # "gen"
    ids = (batch.keys - ds.offsets[None, :]).astype(np.uint64)
    mult = np.uint64(2654435761)  # odd: a bijection modulo 2**32
    salt = np.arange(NUM_SPARSE, dtype=np.uint64) * np.uint64(0x9E3779B9)
    values = (ids * mult + salt[None, :]) & np.uint64(0xFFFFFFFF)
    counts = np.rint(np.expm1(batch.dense.astype(np.float64))).astype(np.int64)
    cols: dict[str, pa.Array] = {"label": pa.array(batch.labels.astype(np.int8))}
    for j in range(NUM_DENSE):
        c = np.where(rng.random(rows) < 0.02, -1 - (counts[:, j] % 3), counts[:, j])
        cols[f"I{j + 1}"] = pa.array(c, mask=rng.random(rows) < missing)
    for f in range(NUM_SPARSE):
        hexes = _hex8(values[:, f])
        gone = pa.array(rng.random(rows) < missing / 2)
        cols[f"C{f + 1}"] = pc.if_else(gone, pa.scalar(None, pa.string()), hexes)
    return pa.table(cols)


def write_tsv(
    out: BinaryIO, lines: int, *, seed: int = 0, first_step: int = 0, missing: float = 0.1
) -> None:
    """``lines`` Criteo-format lines to a binary stream, made from the synthetic stream of
    ``seed`` from chunk ``first_step`` on (a pure function of the arguments)."""
    ds = SyntheticCriteo(seed=seed)
    options = pcsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    done, step = 0, first_step
    while done < lines:
        rows = min(_CHUNK, lines - done)
        pcsv.write_csv(_table(ds, step, rows, missing, seed), out, options)
        done, step = done + rows, step + 1


def write_file(path: str | os.PathLike, lines: int, *, seed: int = 0, first_step: int = 0) -> Path:
    """One generated file (gzipped when the name ends in ``.gz``)."""
    path = Path(path)
    fh: BinaryIO = gzip.open(path, "wb") if path.suffix == ".gz" else open(path, "wb")  # type: ignore[assignment]
    with fh:
        write_tsv(fh, lines, seed=seed, first_step=first_step)
    return path


def write_days(
    folder: str | os.PathLike, days: int, lines_per_day: int, *, seed: int = 0, gz: bool = False
) -> list[Path]:
    """``day_0`` ... ``day_{days-1}`` (``.gz`` with ``gz``) in ``folder``, different lines each."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    steps_per_day = -(-lines_per_day // _CHUNK)
    return [
        write_file(
            folder / (f"day_{d}.gz" if gz else f"day_{d}"),
            lines_per_day,
            seed=seed,
            first_step=d * steps_per_day,
        )
        for d in range(days)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cpu_dist.data.generate", description=__doc__)
    p.add_argument("out", help="output file, or folder with --days")
    p.add_argument("--lines", type=int, default=1_000_000, help="lines (per day with --days)")
    p.add_argument("--days", type=int, default=0, help="write this many day files into OUT")
    p.add_argument("--gzip", action="store_true", help="gzip the day files")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.days:
        write_days(a.out, a.days, a.lines, seed=a.seed, gz=a.gzip)
    else:
        write_file(a.out, a.lines, seed=a.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
