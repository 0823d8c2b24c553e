"""Nothing a user types destroys data: an output flag naming a directory or file of another
kind (converted data, a checkpoint, an export bundle, a TSV file, a folder of the user's) is
refused by ``validate`` (every rank, before MPI and before anything is written) with one
message naming the flag and the path, and the path is left as it was.  One such job under
mpirun stays in tests/integration/test_safe_outputs.py for the real exit path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cpu_dist.common.flags import parse_args
from cpu_dist.common.validate import ConfigError, validate
from cpu_dist.testing.outputs import dir_of, snapshot

pytestmark = pytest.mark.timeout(30)


def tsv_file(tmp: Path) -> Path:
    path = tmp / "day_0.tsv"
    path.write_text("0\t1\t2\n")
    return path


CASES: dict[str, tuple[Callable[[Path], Path], str, str]] = {
    "export over converted data": (
        lambda t: dir_of(t, "kaggle", "cpu_dist-criteo-bin", "labels.u8"),
        "--export",
        "a converted Criteo data directory",
    ),
    "export over a checkpoint step": (
        lambda t: dir_of(t, "step-00000010", "cpu_dist-checkpoint", "dense.pt"),
        "--export",
        "a checkpoint step directory",
    ),
    "tensorboard over a user's folder": (
        lambda t: dir_of(t, "notes", None, "thesis.tex"),
        "--tensorboard",
        "a directory of 1 entries (thesis.tex)",
    ),
    "metrics over a TSV file": (
        tsv_file,
        "--metrics-out",
        "refusing to overwrite a file that is not a metrics log",
    ),
    "dump over a directory": (
        lambda t: dir_of(t, "model", None, "a.bin"),
        "--dump-state",
        "is a directory",
    ),
    "checkpoints into a bundle": (
        lambda t: dir_of(t, "bundle", "cpu_dist-export", "rows.npy"),
        "--checkpoint-dir",
        "is an export bundle, not a checkpoint directory",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_output_of_another_kind_is_refused_naming_the_flag_and_left_untouched(case, tmp_path):
    make, flag, needle = CASES[case]
    target = make(tmp_path)
    before = snapshot(target)
    with pytest.raises(ConfigError) as e:
        validate(parse_args(["--worker-num", "2", flag, str(target)]), 3)
    message = str(e.value)
    assert message.startswith(f"{flag} {target}: ") and needle in message, message
    assert "\n" not in message
    assert snapshot(target) == before


def test_two_outputs_on_one_path_are_refused(tmp_path):
    same = tmp_path / "out"
    argv = ["--worker-num", "2", "--export", str(same), "--tensorboard", str(same)]
    with pytest.raises(ConfigError, match="--export and --tensorboard name the same path"):
        validate(parse_args(argv), 3)
    assert not same.exists()
