"""Bad flags stop every rank before training with one message and a non-zero exit code."""

import pytest

from .launch import SMALL, mpirun

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
        (["--worker-num", "2", "--batch-size", "0"], "--batch-size 0: must be a positive number"),
        (
            ["--worker-num", "2", "--ps_list", "127.0.0.1:99999"],
            "port 99999 is not in 0..65535",
        ),
        (
            ["--worker-num", "2", "--data", "criteo", "--data-path", "/tmp"],
            "--data-path /tmp: is a directory; --data criteo reads one TSV file",
        ),
    ],
)
def test_bad_flags_fail_before_training(argv, needle):
    proc = mpirun(3, argv, timeout=90)
    assert proc.returncode != 0
    assert proc.stderr.count(needle) == 1, proc.stderr  # one message, on every rank's behalf
    assert "step" not in proc.stdout


def test_unknown_flag_is_named_once():
    proc = mpirun(3, ["--worker-num", "2", "--no-such-flag"], timeout=90)
    assert proc.returncode != 0
    assert proc.stderr.count("unrecognized arguments: --no-such-flag") == 1, proc.stderr
    assert "usage:" not in proc.stderr, proc.stderr  # one line, not a dump of every flag


def test_a_flag_without_effect_is_warned_about_once():
    steps = SMALL.index("--max_step") + 1
    argv = ["--worker-num", "2", *SMALL[:steps], "2", *SMALL[steps + 1 :], "--max-staleness", "3"]
    proc = mpirun(3, argv, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warning = "launcher.py: warning: --max-staleness has no effect without --sparse-sync async"
    assert proc.stderr.count(warning) == 1, proc.stderr[-3000:]


def test_a_bad_job_file_is_named_once_before_training(tmp_path):
    job = tmp_path / "job.toml"
    features = ", ".join(f'"cat_{i}"' for i in range(25))  # cat_25 in no table (Criteo data)
    job.write_text(
        f'[job]\nbatch_size = 96\n\n[[tables]]\nname = "t"\nfeatures = [{features}]\n\n'
        '[data]\nkind = "criteo"\n'
    )
    proc = mpirun(3, ["--worker-num", "2", "--config", str(job)], timeout=90)
    assert proc.returncode == 2, proc.stderr[-3000:]
    needle = f"{job}: [[tables]] features: 1 feature(s) of the data in no table: 'cat_25'"
    assert proc.stderr.count(needle) == 1, proc.stderr
    assert "step" not in proc.stdout


def test_a_job_file_value_of_the_wrong_type_is_named_once(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('[job]\nbatch_size = "96"\n')
    proc = mpirun(3, ["--worker-num", "2", "--config", str(job)], timeout=90)
    assert proc.returncode == 2, proc.stderr[-3000:]
    needle = f"{job}: [job] batch_size (--batch-size): expected an integer, got a string ('96')"
    assert proc.stderr.count(needle) == 1, proc.stderr


def test_a_user_model_that_cannot_be_loaded_ends_the_job_with_one_clear_error(tmp_path):
    """A file spec whose file is missing: found before MPI starts, one line from the first
    rank naming the flag, the spec and the path, exit 2; no traceback, no MPI_ABORT banner."""
    missing = tmp_path / "no_such_model.py"
    proc = mpirun(3, ["--worker-num", "2", *SMALL, "--model", f"{missing}:build"], timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = f"launcher.py: error: --model '{missing}:build': {missing} does not exist"
    assert proc.stderr.count(line) == 1, proc.stderr[-3000:]
    assert proc.stderr.count("launcher.py: error:") == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "MPI_ABORT" not in proc.stderr, proc.stderr[-3000:]
