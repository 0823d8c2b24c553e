"""Nothing a user types destroys data: an output flag that names a directory or file of
another kind (converted data, a checkpoint, an export bundle, a TSV file) stops the job, the
converter or the exporter before anything is written, with one message naming the flag, and
leaves the path as it was."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cpu_dist.testing.outputs import dir_of, snapshot

from .launch import ROOT, SMALL, mpirun

pytestmark = pytest.mark.timeout(300)


def test_an_output_of_another_kind_stops_the_job_untouched(tmp_path):
    """The real exit path of one refusal: a TSV file given as --metrics-out (the file a run
    opens first) stops every rank with one message and the file keeps its bytes.  Every kind
    of output refused, and two outputs on one path, are cpu_dist/common/tests/
    test_output_checks.py's, in process."""
    target = tmp_path / "day_0.tsv"
    target.write_text("0\t1\t2\n")
    before = snapshot(target)
    proc = mpirun(3, ["--worker-num", "2", *SMALL, "--metrics-out", str(target)], timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    message = f"launcher.py: error: --metrics-out {target}"
    assert proc.stderr.count(message) == 1, proc.stderr[-2000:]
    assert "refusing to overwrite a file that is not a metrics log" in proc.stderr
    assert '"step"' not in proc.stdout and snapshot(target) == before


def _module(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_the_converter_and_the_exporter_refuse_another_kind(tmp_path):
    tsv = tmp_path / "in.tsv"
    tsv.write_text("1\t" + "\t".join(["1"] * 13 + ["0a"] * 26) + "\n")
    step = dir_of(tmp_path, "step-00000005", "cpu_dist-checkpoint", "dense.pt")
    before = snapshot(step)
    proc = _module("cpu_dist.data.convert", str(tsv), "--output", str(step), "--no-progress")
    assert proc.returncode == 1
    assert f"--output {step}: refusing to write converted Criteo data" in proc.stderr
    data = dir_of(tmp_path, "data", "cpu_dist-criteo-bin", "labels.u8")
    proc = _module("cpu_dist.export", str(step), "--output", str(data))
    assert proc.returncode == 2
    assert f"--output {data}: refusing to write an export bundle" in proc.stderr
    assert "a converted Criteo data directory" in proc.stderr
    assert snapshot(step) == before and (data / "labels.u8").read_bytes() == b"precious labels.u8"
