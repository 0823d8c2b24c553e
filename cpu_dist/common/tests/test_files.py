"""Output paths: what may be overwritten (missing, empty, an earlier output of the same kind)
and what is refused (anything else), and the directory swap that puts a finished output in
place."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cpu_dist.common.files import (
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    OutputError,
    check_output_dir,
    check_output_file,
    is_export_bundle,
    is_metrics_log,
    is_state_dump,
    is_tensorboard_dir,
    rename2,
)


def _manifest(d: Path, fmt: str, *extra: str) -> Path:
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"format": fmt}))
    for name in extra:
        (d / name).write_bytes(b"x")
    return d


def test_a_directory_of_another_kind_is_refused_naming_it(tmp_path):
    data = _manifest(tmp_path / "data", "cpu_dist-criteo-bin", "x.u8")
    with pytest.raises(OutputError, match=r"--export .*data: refusing .*converted Criteo data"):
        check_output_dir(data, "--export", "an export bundle", is_export_bundle)
    step = _manifest(tmp_path / "step-00000010", "cpu_dist-checkpoint", "dense.pt")
    with pytest.raises(OutputError, match="a checkpoint step directory"):
        check_output_dir(step, "--export", "an export bundle", is_export_bundle)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(OutputError, match=r"a directory of 1 entries \(notes.txt\)"):
        check_output_dir(mine, "--tensorboard", "TensorBoard event files", is_tensorboard_dir)
    assert (mine / "notes.txt").read_text() == "keep me"


def test_missing_empty_and_same_kind_directories_are_accepted(tmp_path):
    check_output_dir(tmp_path / "new", "--export", "an export bundle", is_export_bundle)
    (tmp_path / "empty").mkdir()
    check_output_dir(tmp_path / "empty", "--export", "an export bundle", is_export_bundle)
    bundle = _manifest(tmp_path / "b", "cpu_dist-export", "dense.pt", "keys.npy", "rows.npy")
    check_output_dir(bundle, "--export", "an export bundle", is_export_bundle)
    (bundle / "model").mkdir()  # the copy of a user model's source (cpu_dist/export)
    (bundle / "model" / "towers.py").write_text("x")
    check_output_dir(bundle, "--export", "an export bundle", is_export_bundle)
    (bundle / "model" / "notes.txt").write_text("x")  # not a model source: the user's
    with pytest.raises(OutputError):
        check_output_dir(bundle, "--export", "an export bundle", is_export_bundle)
    (bundle / "model" / "notes.txt").unlink()
    (bundle / "towers.py").write_text("x")  # a source outside model/: the user's
    with pytest.raises(OutputError):
        check_output_dir(bundle, "--export", "an export bundle", is_export_bundle)
    (bundle / "towers.py").unlink()
    (bundle / "my-notes.txt").write_text("x")  # a bundle with the user's files in it
    with pytest.raises(OutputError):
        check_output_dir(bundle, "--export", "an export bundle", is_export_bundle)
    tb = tmp_path / "tb"
    (tb / "sub").mkdir(parents=True)
    (tb / "sub" / "events.out.tfevents.1.host").write_bytes(b"")
    check_output_dir(tb, "--tensorboard", "TensorBoard event files", is_tensorboard_dir)


def test_files_are_overwritten_only_when_they_are_the_same_kind(tmp_path):
    tsv = tmp_path / "day_0.tsv"
    tsv.write_text("1\t2\t3\n")
    with pytest.raises(OutputError, match=r"--metrics-out .*refusing to overwrite"):
        check_output_file(tsv, "--metrics-out", "a metrics log", is_metrics_log)
    with pytest.raises(OutputError, match=r"--dump-state .*refusing to overwrite"):
        check_output_file(tsv, "--dump-state", "a state dump", is_state_dump)
    with pytest.raises(OutputError, match="is a directory"):
        check_output_file(tmp_path, "--dump-state", "a state dump", is_state_dump)
    log = tmp_path / "m.jsonl"
    log.write_text('{"step": 10, "loss": 0.5}\n')
    check_output_file(log, "--metrics-out", "a metrics log", is_metrics_log)
    dump = tmp_path / "d.npz"
    np.savez(dump, sparse_keys=np.zeros(1, np.int64))
    check_output_file(dump, "--dump-state", "a state dump", is_state_dump)
    other = tmp_path / "o.npz"
    np.savez(other, weights=np.zeros(1))
    with pytest.raises(OutputError):
        check_output_file(other, "--dump-state", "a state dump", is_state_dump)
    check_output_file(tmp_path / "new.npz", "--dump-state", "a state dump", is_state_dump)


def test_rename2_without_replacing_refuses_even_an_empty_directory(tmp_path):
    """os.rename replaces an empty directory; RENAME_NOREPLACE (a step directory's publish,
    two runs never sharing one) refuses it, and the source stays where it was."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "f").write_text("x")
    dst.mkdir()
    with pytest.raises(FileExistsError):
        assert rename2(src, dst, RENAME_NOREPLACE)
    assert (src / "f").exists() and not any(dst.iterdir())
    dst.rmdir()
    assert rename2(src, dst, RENAME_NOREPLACE)
    assert (dst / "f").read_text() == "x" and not src.exists()


def test_rename2_exchanges_two_directories_in_one_step(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, text in ((a, "A"), (b, "B")):
        d.mkdir()
        (d / "f").write_text(text)
    assert rename2(a, b, RENAME_EXCHANGE)
    assert (a / "f").read_text() == "B" and (b / "f").read_text() == "A"
