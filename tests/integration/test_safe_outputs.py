"""Nothing a user types destroys data: an output flag that names a directory or file of
another kind (converted data, a checkpoint, an export bundle, a TSV file) stops the job, the
converter or the exporter before anything is written, with one message naming the flag, and
leaves the path as it was."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .launch import ROOT, SMALL, mpirun

pytestmark = pytest.mark.timeout(300)


def _snapshot(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def _dir_of(tmp: Path, name: str, fmt: str | None, *files: str) -> Path:
    d = tmp / name
    d.mkdir()
    if fmt is not None:
        (d / "manifest.json").write_text(json.dumps({"format": fmt, "version": 1}))
    for f in files:
        (d / f).write_bytes(b"precious " + f.encode())
    return d


CASES = {
    "export over converted data": (
        lambda t: _dir_of(t, "kaggle", "cpu_dist-criteo-bin", "labels.u8"),
        "--export",
        "a converted Criteo data directory",
    ),
    "export over a checkpoint step": (
        lambda t: _dir_of(t, "step-00000010", "cpu_dist-checkpoint", "dense.pt"),
        "--export",
        "a checkpoint step directory",
    ),
    "tensorboard over a user's folder": (
        lambda t: _dir_of(t, "notes", None, "thesis.tex"),
        "--tensorboard",
        "a directory of 1 entries (thesis.tex)",
    ),
    "metrics over a TSV file": (
        lambda t: (t / "day_0.tsv", (t / "day_0.tsv").write_text("0\t1\t2\n"))[0],
        "--metrics-out",
        "refusing to overwrite a file that is not a metrics log",
    ),
    "dump over a directory": (
        lambda t: _dir_of(t, "model", None, "a.bin"),
        "--dump-state",
        "is a directory",
    ),
    "checkpoints into a bundle": (
        lambda t: _dir_of(t, "bundle", "cpu_dist-export", "rows.npy"),
        "--checkpoint-dir",
        "is an export bundle, not a checkpoint directory",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_output_of_another_kind_stops_the_job_untouched(case, tmp_path):
    make, flag, needle = CASES[case]
    target = make(tmp_path)
    before = _snapshot(target)
    proc = mpirun(3, ["--worker-num", "2", *SMALL, flag, str(target)], timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    message = f"launcher.py: error: {flag} {target}"
    assert proc.stderr.count(message) == 1, proc.stderr[-2000:]
    assert needle in proc.stderr, proc.stderr[-2000:]
    assert '"step"' not in proc.stdout and _snapshot(target) == before


def test_two_outputs_on_one_path_are_refused(tmp_path):
    same = tmp_path / "out"
    argv = ["--worker-num", "2", *SMALL, "--export", str(same), "--tensorboard", str(same)]
    proc = mpirun(3, argv, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("--export and --tensorboard name the same path") == 1, proc.stderr
    assert not same.exists()


def _module(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_the_converter_and_the_exporter_refuse_another_kind(tmp_path):
    tsv = tmp_path / "in.tsv"
    tsv.write_text("1\t" + "\t".join(["1"] * 13 + ["0a"] * 26) + "\n")
    step = _dir_of(tmp_path, "step-00000005", "cpu_dist-checkpoint", "dense.pt")
    before = _snapshot(step)
    proc = _module("cpu_dist.data.convert", str(tsv), "--output", str(step), "--no-progress")
    assert proc.returncode == 1
    assert f"--output {step}: refusing to write converted Criteo data" in proc.stderr
    data = _dir_of(tmp_path, "data", "cpu_dist-criteo-bin", "labels.u8")
    proc = _module("cpu_dist.export", str(step), "--output", str(data))
    assert proc.returncode == 2
    assert f"--output {data}: refusing to write an export bundle" in proc.stderr
    assert "a converted Criteo data directory" in proc.stderr
    assert _snapshot(step) == before and (data / "labels.u8").read_bytes() == b"precious labels.u8"
