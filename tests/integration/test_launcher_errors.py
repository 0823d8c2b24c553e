"""Bad flags stop every rank before training with one message and a non-zero exit code."""

import pytest

from .launch import mpirun

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (
            ["--worker-num", "2", "--batch-size", "7"],
            "--batch-size 7 is not divisible by --worker-num 2",
        ),
        (["--worker-num", "3"], "leaves no PS rank"),
        (
            ["--worker-num", "2", "--data", "criteo", "--data-path", "/no/such.tsv"],
            "/no/such.tsv: no such file",
        ),
    ],
)
def test_bad_flags_fail_before_training(argv, needle):
    proc = mpirun(3, argv, timeout=90)
    assert proc.returncode != 0
    assert proc.stderr.count(needle) == 1, proc.stderr  # one message, on every rank's behalf
    assert "step" not in proc.stdout


def test_unknown_flag_is_named():
    proc = mpirun(2, ["--worker-num", "1", "--no-such-flag"], timeout=90)
    assert proc.returncode != 0
    assert "--no-such-flag" in proc.stderr
