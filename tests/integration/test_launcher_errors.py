"""Bad flags stop every rank before training with one message and a non-zero exit code.

One real mpirun job per way a job can be refused before it trains: a flag argparse refuses,
a ConfigError from validate, a job-file error, a model path found missing before MPI.  The
messages themselves are tested in process, beside the code that makes them
(cpu_dist/common/tests/test_config.py, test_flag_messages.py, test_job_file.py,
test_output_checks.py); the runtime errors' exit is tests/integration/test_runtime_errors.py's.
"""

import pytest

from .launch import SMALL, mpirun

pytestmark = pytest.mark.timeout(120)


def test_bad_flags_fail_before_training():
    """A ConfigError from validate, which every rank reaches."""
    proc = mpirun(3, ["--worker-num", "2", "--batch-size", "7"], timeout=90)
    assert proc.returncode == 2, proc.stderr
    needle = "--batch-size 7 is not divisible by --worker-num 2"
    assert proc.stderr.count(needle) == 1, proc.stderr  # one message, on every rank's behalf
    assert "step" not in proc.stdout


def test_unknown_flag_is_named_once():
    proc = mpirun(3, ["--worker-num", "2", "--no-such-flag"], timeout=90)
    assert proc.returncode != 0
    assert proc.stderr.count("unrecognized arguments: --no-such-flag") == 1, proc.stderr
    assert "usage:" not in proc.stderr, proc.stderr  # one line, not a dump of every flag


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
