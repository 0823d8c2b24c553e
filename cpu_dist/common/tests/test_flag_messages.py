"""Each bad flag is named for what is wrong with it (not a neighbouring rule's message), and a
flag that changes nothing in the chosen mode is warned about."""

from __future__ import annotations

import pytest

from cpu_dist.common.first_rank import launch_rank
from cpu_dist.common.flags import parse_args
from cpu_dist.common.validate import ConfigError, validate

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--batch-size", "0"], "--batch-size 0: must be a positive number"),
        (["--batch-size", "-4"], "--batch-size -4: must be a positive number"),
        (["--ps_list", "h:99999"], "--ps_list entry 'h:99999': port 99999 is not in 0..65535"),
        (["--ps_list", "h"], "--ps_list entry 'h': expected host:port"),
        (["--eval-batches", "0"], "--eval-batches 0: must be -1 (all) or positive"),
        (["--max_step", "0"], "--max_step 0: must be >= 1"),
    ],
)
def test_the_message_names_the_cause(argv, message):
    with pytest.raises(ConfigError) as e:
        validate(parse_args(argv), 2 if "--ps_list" not in argv else 1)
    assert message in str(e.value)


def test_a_directory_given_as_a_tsv_file_is_named_a_directory(tmp_path):
    with pytest.raises(ConfigError) as e:
        validate(parse_args(["--data", "criteo", "--data-path", str(tmp_path)]), 3)
    assert (
        str(e.value) == f"--data-path {tmp_path}: is a directory; --data criteo reads one TSV file"
    )
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"\(a converted directory: --data criteo-bin\)"):
        validate(parse_args(["--data", "criteo", "--data-path", str(tmp_path)]), 3)
    tsv = tmp_path / "day_0"
    tsv.write_text("")
    with pytest.raises(ConfigError, match="is a file; --data criteo-bin reads a directory"):
        validate(parse_args(["--data", "criteo-bin", "--data-path", str(tsv)]), 3)


def test_flags_without_effect_are_warned_about_once(capsys):
    validate(parse_args(["--max-staleness", "4", "--optimization-cache-capacity", "16"]), 3)
    err = capsys.readouterr().err
    assert err.count("warning: --max-staleness has no effect without --sparse-sync async") == 1
    assert "--optimization-cache-capacity has no effect without --read-mode bagpipe" in err
    validate(parse_args(["--max-staleness", "4", "--sparse-sync", "async"]), 3)
    validate(parse_args([]), 3)  # defaults are never "given"
    assert capsys.readouterr().err == ""


def test_only_the_first_rank_prints_the_warnings(capsys, monkeypatch):
    """Every rank validates the same flags; the job's one warning is rank 0's."""
    argv = ["--max-staleness", "4"]
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    validate(parse_args(argv), 3)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    validate(parse_args(argv), 3)
    warning = "launcher.py: warning: --max-staleness has no effect without --sparse-sync async"
    assert capsys.readouterr().err.count(warning) == 1


def test_only_the_first_rank_prints_a_parse_error(capsys, monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    assert launch_rank() == 1
    with pytest.raises(SystemExit) as e:
        parse_args(["--no-such-flag"])
    assert e.value.code == 0 and capsys.readouterr().err == ""  # rank 0 reports (and fails)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    with pytest.raises(SystemExit) as e:
        parse_args(["--no-such-flag"])
    assert e.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_a_job_file_value_of_the_wrong_type_is_one_line_from_the_first_rank(
    tmp_path, capsys, monkeypatch
):
    """A ``[job]`` value sets a flag's default, so a bad one ends the parse as a bad flag does:
    the file, the key, the flag and what was found, in one line, exit 2, from rank 0 alone."""
    job = tmp_path / "job.toml"
    job.write_text('[job]\nbatch_size = "96"\n')
    line = (
        f"launcher.py: error: {job}: [job] batch_size (--batch-size): expected an integer, "
        "got a string ('96')\n"
    )
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    with pytest.raises(SystemExit) as e:
        parse_args(["--config", str(job)])
    assert e.value.code == 0 and capsys.readouterr().err == ""
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    with pytest.raises(SystemExit) as e:
        parse_args(["--config", str(job)])
    assert e.value.code == 2 and capsys.readouterr().err == line
